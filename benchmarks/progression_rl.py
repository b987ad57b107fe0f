"""RL where supervised training leaves errors (issue 43, demonstration 3): the arithmetic-
progression model, trained on differences up to 500, asked for the next terms of progressions
whose differences run to 1,248; RL with the progression verifier on such prompts, accuracy on
held-out ones before and after.

    .venv/bin/python benchmarks/progression_rl.py --work runs/progression-rl \\
        --out runs/progression-rl/figures.json

1. data    `sheepop progression generate` of 4-digit terms: first term 0-999, difference
           1-500, 4-18 terms (4,000 sequences; every term below 9,500)
2. sft     the preset of before digit places (`--preset progression-sinusoidal --directions
           up`: absolute positions, the model docs/progression.md shows failing beyond its
           training differences), --sft-steps steps (2,000)
3. before  greedy next term(s) on the held-out prompts of `sheepop rl --task progression`: its
           prompts draw the difference from 1 to 9,999 // (2 x 4) - 1 = 1,248 and the first term
           so that every term fits in 4 digits, so 501-1,248 are differences the model never
           saw; the accuracy by difference range
4. rl      sheepop.rl.start.reinforce, the code of `sheepop rl SFT --task progression
           --set rl.answer_terms=N`, for N = 1 (the next term from three) and 2 (two terms at
           once from two): --rl-steps steps (200) of 8 prompts x 8 answers, full fine-tuning at
           rl's default rate; the verifier scores the share of the terms right
5. after   the same held-out prompts, greedy

The held-out prompts are the run's own (rl.eval_prompts, --heldout: 1,000, apart from the
training prompts): the run logs their pass@1 at step 0 and at the end, and this script checks
that its own count, by difference range, gives the same figures. One thread throughout; the
machine line and the load at the start and the end are printed, the figures go to --out as
JSON.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # (before NumPy and torch load)
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import machine  # noqa: E402
import numpy as np  # noqa: E402

from sheepop.checkpoint import format as checkpoint  # noqa: E402
from sheepop.config.build import build_config  # noqa: E402
from sheepop.inference.load import load  # noqa: E402
from sheepop.progression.data import load_progressions, write_dataset  # noqa: E402
from sheepop.progression.spec import Spec  # noqa: E402
from sheepop.progression.task import TaskOptions, train  # noqa: E402
from sheepop.rl import tasks  # noqa: E402
from sheepop.rl.rollouts import sample_answers  # noqa: E402
from sheepop.rl.start import reinforce  # noqa: E402
from sheepop.rl.verifiers import progression_reward  # noqa: E402

SPEC = Spec(count=4000, first_max=999, max_difference=500, min_terms=4, max_terms=18,
            digits=4, ood_count=0, seed=0)
RANGES = [(1, 500), (501, 800), (801, 1000), (1001, 1248)]  # training's, then beyond it
SEED = 1337  # train.seed: the rl task's prompts and their split


def supervised(work: Path, steps: int) -> Path:
    """The SFT run (trained unless WORK/sft holds one)."""
    run = work / "sft"
    if checkpoint.holds_checkpoint(run):
        return run
    if not (work / "data" / "meta.json").is_file():
        write_dataset(work / "data", SPEC)
    data = load_progressions(work / "data")
    cfg = build_config("progression-sinusoidal", None, [
        f"train.steps={steps}", "train.warmup_steps=50", "train.eval_interval=0",
        "train.checkpoint_interval=0", "train.threads=1"])
    opts = TaskOptions(data.digits, window_terms=4, reverse_digits=True,
                       data=str(work / "data"), both_ways=False)
    train(data, cfg, opts, run, progress=False, log=lambda *_: None)
    return run


def held_out(run: Path, answer_terms: int, count: int) -> list[dict]:
    """The held-out prompts of `sheepop rl RUN --task progression` (its split, its seed)."""
    opts = TaskOptions.load(run)
    items = tasks.progression_items(opts.digits, opts.window_terms - answer_terms, answer_terms,
                                    SEED, opts.reverse_digits)
    return tasks.split(items, count, SEED)[1]


def difference(record: dict) -> int:
    last = record["prompt"].split()[-1]
    return record["answer"][0] - int(last[::-1] if record["reverse_digits"] else last)


def scored(run: Path, records: list[dict], answer_terms: int) -> dict:
    """Greedy answers of RUN's model: pass@1 (every term right) overall and by difference
    range, and the mean reward (the share of terms right)."""
    model = load(run, "torch")
    ids = [model.tokenizer.encode(r["prompt"]) for r in records]
    digits = len(records[0]["prompt"].split()[0])
    answers = sample_answers(model, records, ids, 1, progression_reward, model.tokenizer.eos_id,
                             answer_terms * (digits + 1) - 1, 0.0, None)
    right = answers.rewards >= 1
    d = np.array([difference(r) for r in records])
    by_range = {f"{lo}-{hi}": [int(right[(d >= lo) & (d <= hi)].sum()),
                               int(((d >= lo) & (d <= hi)).sum())] for lo, hi in RANGES}
    return {"pass@1": float(right.mean()), "reward": float(answers.rewards.mean()),
            "by_difference": by_range}


def row(label: str, figures: dict) -> str:
    ranges = "  ".join(f"{k}: {100 * r / max(n, 1):6.2f}% ({r}/{n})"
                       for k, (r, n) in figures["by_difference"].items())
    return (f"  {label:<6} pass@1 {100 * figures['pass@1']:6.2f}%, terms right "
            f"{100 * figures['reward']:6.2f}%;  by difference  {ranges}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, default=Path("runs/progression-rl"))
    p.add_argument("--sft-steps", type=int, default=2000)
    p.add_argument("--rl-steps", type=int, default=200)
    p.add_argument("--heldout", type=int, default=1000)
    p.add_argument("--answer-terms", default="1,2", help="the rl runs' rl.answer_terms")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    import torch
    torch.set_num_threads(1)
    described = machine.describe(threads=1)
    print(machine.summary(described), flush=True)
    t0 = time.perf_counter()
    sft = supervised(args.work, args.sft_steps)
    sft_seconds = time.perf_counter() - t0
    print(f"supervised: {args.sft_steps} steps of the progression-sinusoidal preset on "
          f"differences 1-500 in {sft_seconds:.0f} s", flush=True)
    figures = {"sft_steps": args.sft_steps, "rl_steps": args.rl_steps,
               "heldout": args.heldout, "sft_seconds": round(sft_seconds), "runs": {},
               "machine": described}
    for n in (int(v) for v in args.answer_terms.split(",")):
        records = held_out(sft, n, args.heldout)
        before = scored(sft, records, n)
        out = args.work / f"rl-{n}term"
        t1 = time.perf_counter()
        reinforce(str(sft), None, out, overrides=[
            "rl.task=progression", f"rl.answer_terms={n}", f"rl.eval_prompts={args.heldout}",
            f"train.steps={args.rl_steps}", f"train.eval_interval={max(args.rl_steps // 4, 1)}",
            "train.threads=1", f"train.seed={SEED}"], log=lambda *_: None)
        seconds = time.perf_counter() - t1
        after = scored(out, records, n)
        logged = [(r["step"], r["pass@1"]) for r in map(
            json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "pass@1" in r]
        # the run's own log and this count are the same greedy answers to the same prompts
        agree = (round(before["pass@1"], 6) == round(logged[0][1], 6)
                 and round(after["pass@1"], 6) == round(logged[-1][1], 6))
        print(f"rl.answer_terms={n} ({4 - n} terms given): {args.rl_steps} steps in "
              f"{seconds:.0f} s; {args.heldout} held-out prompts"
              + ("" if agree else f" (the run's log says {logged}: NOT the same)"))
        print(row("before", before))
        print(row("after", after), flush=True)
        figures["runs"][f"answer_terms_{n}"] = {"before": before, "after": after,
                                                "rl_seconds": round(seconds),
                                                "pass@1_by_step": logged, "log_agrees": agree}
    figures["seconds"] = round(time.perf_counter() - t0)
    figures["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    print(f"{figures['seconds']} s in all; load average at the end "
          f"{' '.join(f'{x:.2f}' for x in figures['load_average_end'])}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Which preset trains best on a CPU in `make run`'s time: tiny (nanoGPT's recipe at tiny's
shape) against `cpu` (the same shape with the modern recipe) and variants of it.

    python benchmarks/cpu_preset.py                 # tiny's 1,500 steps against each candidate
    python benchmarks/cpu_preset.py --steps 300     # a quick look
    python benchmarks/cpu_preset.py --only tiny,cpu,cpu-no-warmup --seed 2   # another seed
    python benchmarks/cpu_preset.py --only cpu,cpu-no-warmup --equal-steps 1250  # the same work
    python benchmarks/cpu_preset.py --only cpu,cpu-momentum-0.95 --equal-steps 1250 --seed 2

Each candidate's step costs what its pieces cost (Muon's iteration, RMSNorm), so "the same
time" is not "the same steps": each candidate's step is timed first (the candidates
alternating, a few steps each, after a warm-up), and it then trains for tiny's `--steps` times
tiny's step over its own, so that its schedule ends when tiny's time does (or, with
`--equal-steps N`, every candidate trains N steps, untimed: candidates whose steps cost the
same compared without the timing's noise). The runs alternate
too, on the built-in data `make run` trains on; each prints its last validation loss (the
same held-out windows for all) and its wall time. The load average is printed beside them: the
machine is shared.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import machine
import torch

from sheepop.config.build import build_config
from sheepop.data.dataset import load_dataset
from sheepop.train.start import setup

CANDIDATES = {
    "tiny": ("tiny", []),
    "cpu": ("cpu", []),
    "cpu-adamw": ("cpu", ["train.optimizer=adamw"]),
    "cpu-layernorm": ("cpu", ["model.norm=layernorm"]),
    "cpu-no-warmup": ("cpu", ["train.warmup_steps=0"]),  # the speedrun's no_warmup piece
    # torch's default Muon momentum; the preset takes the speedrun's 0.9 (docs/speedrun.md).
    "cpu-momentum-0.95": ("cpu", ["train.muon_momentum=0.95"]),
}


def trainer_for(preset: str, sets: list[str], steps: int, folder: str, dataset):
    cfg = build_config(preset, None, [*sets, f"train.steps={steps}", "train.checkpoint_interval=0",
                                      f"train.eval_interval={max(1, steps // 6)}",
                                      "train.log_interval=1000000"])
    return setup(None, cfg, Path(folder) / "run", dataset=dataset, progress=False,
                 log=lambda *_: None)


def step_seconds(preset: str, sets: list[str], dataset, steps: int = 12) -> float:
    """Median seconds a step, over `steps` steps after two of warm-up (no evaluation)."""
    with tempfile.TemporaryDirectory() as tmp:
        trainer = trainer_for(preset, sets, 10_000, tmp, dataset)
        times = []
        for i in range(steps + 2):
            batch = [trainer.sampler.next_batch()]
            t0 = time.perf_counter()
            trainer.engine.train_step(batch, trainer.cfg.train.lr)
            if i >= 2:
                times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1500, help="tiny's steps (make run's)")
    ap.add_argument("--only", default="", help="comma-separated candidate names")
    ap.add_argument("--seed", type=int, default=None,
                    help="train.seed for every candidate (weights and batches; default: the "
                         "presets' own, 1337)")
    ap.add_argument("--equal-steps", type=int, default=0,
                    help="train every candidate this many steps instead (no step timing)")
    args = ap.parse_args()
    seeded = [] if args.seed is None else [f"train.seed={args.seed}"]
    names = [n for n in CANDIDATES if not args.only or n in args.only.split(",")]
    print(machine.summary())
    dataset = load_dataset(None, build_config("tiny", None, []).data)
    if args.equal_steps:
        print(f"{args.equal_steps} steps each (load {os.getloadavg()[0]:.1f})", flush=True)
    else:
        per_step = {n: [] for n in names}
        for _ in range(3):  # alternating rounds, so a burst of load lands on every candidate
            for n in names:
                per_step[n].append(step_seconds(*CANDIDATES[n], dataset))
        step_s = {n: statistics.median(v) for n, v in per_step.items()}
        budget = args.steps * step_s["tiny"]
        print("step times (median of 3 rounds): "
              + ", ".join(f"{n} {1000 * s:.1f} ms" for n, s in step_s.items())
              + f"; tiny's {args.steps} steps ~ {budget:.0f} s  (load {os.getloadavg()[0]:.1f})",
              flush=True)
    print("| preset | steps | step x tiny | val loss | seconds | load |")
    print("|---|---|---|---|---|---|")
    for n in names:
        steps = args.equal_steps or max(1, round(budget / step_s[n]))
        with tempfile.TemporaryDirectory() as tmp:
            preset, sets = CANDIDATES[n]
            trainer = trainer_for(preset, [*sets, *seeded], steps, tmp, dataset)
            torch.manual_seed(0)
            t0 = time.perf_counter()
            summary = trainer.run()
            seconds = time.perf_counter() - t0
        ratio = "-" if args.equal_steps else f"{step_s[n] / step_s['tiny']:.2f}"
        print(f"| {n} | {steps} | {ratio} | {summary.val_loss:.4f} | "
              f"{seconds:.0f} | {os.getloadavg()[0]:.1f} |", flush=True)


if __name__ == "__main__":
    main()

"""Progression task benchmark: train each variant for a budget, then measure exact match.

    python benchmarks/progression.py                      # the headline: torch, 10 minutes
    OPENBLAS_NUM_THREADS=1 python benchmarks/progression.py --minutes 30 --variant np:engine=numpy
    python benchmarks/progression.py --steps 1500 --eval-sequences 300 --threads 1 \
        --variant base: --variant written:reverse=0 --variant m3:terms=3

A variant is NAME:key=value,... with keys `terms` (window terms), `reverse` (1: digits
reversed, the default; 0: written order), `mask` (given terms without loss: 2 or 0), `engine`,
or any config key (`model.n_embd=64`, `train.lr=2e-3`). Each variant trains from the same data
with the `progression` preset and is evaluated on every held-out prefix (and the OOD sets with
--ood). One line per variant: steps, seconds, ms/step, next-term / per-digit / continuation
accuracy; a JSON line at the end.

Timings depend on what else runs on the machine: say so when you quote them.
"""

from __future__ import annotations

import os
import sys

if "--threads" in sys.argv[:-1]:  # BLAS threads are fixed when NumPy loads: set them first
    os.environ.setdefault("OPENBLAS_NUM_THREADS", sys.argv[sys.argv.index("--threads") + 1])

import argparse  # noqa: E402
import json  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import machine  # noqa: E402

from sheepop.config.build import build_config  # noqa: E402
from sheepop.inference.load import load  # noqa: E402
from sheepop.progression.data import Spec, load_progressions, write_dataset  # noqa: E402
from sheepop.progression.report import evaluate_sets, plot, table  # noqa: E402
from sheepop.progression.task import TaskOptions, train  # noqa: E402

TASK_KEYS = {"terms", "reverse", "mask", "engine"}


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    name, _, rest = text.partition(":")
    pairs = [p.split("=", 1) for p in rest.split(",") if p]
    if any(len(p) != 2 for p in pairs):
        raise SystemExit(f"bad variant {text!r}: NAME:key=value,...")
    return name or "base", dict(pairs)


def run_variant(name: str, keys: dict[str, str], data_dir: Path, work: Path,
                args: argparse.Namespace) -> dict:
    data = load_progressions(data_dir)
    overrides = [f"{k}={v}" for k, v in keys.items() if k not in TASK_KEYS]
    overrides.append(f"train.engine={keys.get('engine', 'torch')}")
    if args.threads:
        overrides.append(f"train.threads={args.threads}")
    if args.steps:
        overrides.append(f"train.steps={args.steps}")
    cfg = build_config("progression", None, overrides)
    opts = TaskOptions(data.digits, int(keys.get("terms", 4)), keys.get("reverse", "1") == "1",
                       int(keys.get("mask", 2)), str(data_dir))
    run_dir = work / name
    t0 = time.perf_counter()
    summary = train(data, cfg, opts, run_dir, None if args.steps else args.minutes,
                    progress=False, log=lambda *_: None)
    seconds = time.perf_counter() - t0
    model = load(run_dir, cfg.train.engine, "cpu")
    if not args.ood:
        data.ood = {}
    report = evaluate_sets(model, data, opts, args.eval_sequences)
    if args.verbose:
        print(table(report))
    if args.plot:
        plot(report, args.plot, title=f"{name}: {summary.steps} steps, {seconds / 60:.1f} min")
    held = report["sets"]["heldout"]
    row = {"variant": name, **keys, "steps": summary.steps, "train_seconds": round(seconds, 1),
           "ms_per_step": round(1000 * seconds / max(summary.steps, 1), 1),
           "final_loss": round(summary.train_loss, 4),
           "val_loss": None if summary.val_loss is None else round(summary.val_loss, 4),
           "next_term": held["next_term_accuracy"], "per_digit": held["digit_accuracy"],
           "continuation": held["continuation_accuracy"], "eval_seconds": report["seconds"],
           "n_prefixes": held["n_prefixes"]}
    for set_name, s in report["sets"].items():
        if set_name != "heldout":
            row[f"{set_name}_next_term"] = s["next_term_accuracy"]
    print(f"{name:<14} {row['steps']:>6} steps {seconds:>7.1f} s {row['ms_per_step']:>7.1f} "
          f"ms/step  loss {row['final_loss']:.4f}  next term {100 * row['next_term']:6.2f}%  "
          f"digit {100 * row['per_digit']:6.2f}%  rest {100 * row['continuation']:6.2f}%  "
          f"(eval {report['seconds']:.1f} s, {row['n_prefixes']:,} prefixes)", flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", help="a data directory (default: generate the standard one)")
    p.add_argument("--minutes", type=float, default=10.0, help="training budget per variant")
    p.add_argument("--steps", type=int, default=0, help="fixed steps instead of --minutes")
    p.add_argument("--threads", type=int, default=0, help="train.threads (0: torch's default)")
    p.add_argument("--eval-sequences", type=int, default=0,
                   help="evaluate the first N sequences of each set (0: all)")
    p.add_argument("--ood", action="store_true", help="also evaluate the OOD sets")
    p.add_argument("--verbose", action="store_true", help="print the full table per variant")
    p.add_argument("--plot", help="write the (last) variant's progression plot here")
    p.add_argument("--work", help="keep the runs in this directory (default: a temporary one)")
    p.add_argument("--variant", action="append", default=[], metavar="NAME:k=v,...")
    args = p.parse_args(argv)
    variants = [parse_variant(v) for v in args.variant] or [("torch", {})]
    print(machine.summary(), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work or tmp)
        data_dir = Path(args.data) if args.data else work / "data"
        if not args.data:
            write_dataset(data_dir, Spec())
        rows = [run_variant(name, keys, data_dir, work, args) for name, keys in variants]
    print(json.dumps({"minutes": None if args.steps else args.minutes, "steps": args.steps,
                      "rows": rows, "machine": machine.describe()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

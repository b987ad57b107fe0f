"""`sheepop generate` start-up: time to the first token and total wall time of fresh processes.

    nice -n 10 python benchmarks/startup.py                      # trains a tiny run in a temp dir
    nice -n 10 python benchmarks/startup.py --run RUN --variant torch="--engine torch"

Each round starts one fresh `sheepop generate RUN --prompt "def " --max-new-tokens 20` per
variant (the variants take turns, so a change in the machine's load affects them alike) and
reads its stdout from a pipe: the time to the first token is the time from starting the process
to the first byte on the pipe (the command writes the prompt with the first token and flushes),
the total the time to its exit. Printed: the median and the minimum over the rounds of each, and
the load average at the start and the end. Without --run, a `tiny` preset run is trained for one
step on a piece of sheepop's own source (the weights do not change the timing).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import machine

VARIANTS = {"torch (--engine torch, before)": "--engine torch",
            "auto (default)": ""}
SRC = Path(__file__).resolve().parents[1] / "src" / "sheepop"


def sheepop() -> list[str]:
    found = Path(sys.executable).parent / "sheepop"
    return [str(found)] if found.exists() else [sys.executable, "-m", "sheepop"]


def tiny_run(where: Path) -> Path:
    text = where / "text.txt"
    text.write_text("".join(p.read_text(encoding="utf-8") for p in sorted(SRC.glob("*.py"))),
                    encoding="utf-8")
    run = where / "run"
    subprocess.run([*sheepop(), "train", str(text), "--out", str(run), "--preset", "tiny",
                    "--steps", "1", "--no-progress", "--set", "train.eval_batches=1"],
                   check=True, capture_output=True, timeout=600)
    return run


def one(argv: list[str]) -> tuple[float, float]:
    """(seconds to the first byte on stdout, seconds to the exit) of one fresh process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    first = proc.stdout.read(1)
    t_first = time.perf_counter() - t0
    proc.stdout.read()
    if proc.wait() != 0 or not first:
        raise SystemExit(f"failed: {' '.join(argv)}")
    return t_first, time.perf_counter() - t0


def uptime() -> str:
    return "load average {:.2f}, {:.2f}, {:.2f}".format(*os.getloadavg())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", help="a run directory (default: train a tiny one)")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=20)
    p.add_argument("--variant", action="append", metavar="NAME=ARGS",
                   help="a named set of extra generate arguments (repeatable; default: "
                        + "; ".join(f"{k}: {v or 'none'}" for k, v in VARIANTS.items()) + ")")
    args = p.parse_args()
    variants = (dict(v.split("=", 1) for v in args.variant) if args.variant else VARIANTS)
    tmp = None
    if args.run is None:
        tmp = Path(tempfile.mkdtemp(prefix="sheepop-startup-"))
        args.run = str(tiny_run(tmp))
    try:
        print(f"start: {machine.summary()}", flush=True)
        base = [*sheepop(), "generate", args.run, "--prompt", "def ", "--max-new-tokens",
                str(args.max_new_tokens), "--temperature", "0"]
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
        one(base)  # the first run fills the file cache
        for _ in range(args.rounds):
            for name, extra in variants.items():
                times[name].append(one(base + extra.split()))
        print(f"{'variant':<32} {'first token s (median, min)':>28} {'total s (median, min)':>24}")
        for name, runs in times.items():
            first, total = [r[0] for r in runs], [r[1] for r in runs]
            print(f"{name:<32} {statistics.median(first):>19.3f} {min(first):>8.3f} "
                  f"{statistics.median(total):>15.3f} {min(total):>8.3f}")
        print(f"rounds: {args.rounds}; end: {uptime()}")
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Randomized `kill -9` during training with a checkpoint every step, then `--resume`.

    .venv/bin/python benchmarks/kill_resume.py [--trials 200] [--seed 0] [--max-delay 1.0]

Each trial trains a tiny model (`sheepop train DATA --out R`, NumPy engine, a checkpoint every
step) in a child process and, once its first checkpoint is on disk, kills it with SIGKILL after
a random delay (uniform in [0, --max-delay] s). Then, before anything recovers the run:

  - what the kill interrupted is classified: a save before its commit record, a save after it
    (installing), or no save (between saves);
  - a reader (`sheepop.inference.load.read_run`, what `generate` uses, and `load_trainer_state` with
    its hash check) must load a complete checkpoint; its step S is noted;

then `sheepop train DATA --resume --out R --steps S+1` must say "resuming R at step S", exit 0 and
leave a checkpoint of step S+1. Printed: the trials, the kills in each moment, and how many
resumes were refused (issue 13 measured 19 of 37 before the all-or-nothing save). Record the
machine and its load with the figures.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import machine

from sheepop.checkpoint import format as checkpoint
from sheepop.inference.load import read_run

TINY = ["--engine", "numpy", "--no-progress", "--set", "model.n_layer=1",
        "--set", "model.n_embd=16", "--set", "model.n_head=2", "--set", "model.block_size=16",
        "--set", "train.batch_size=2", "--set", "train.checkpoint_interval=1",
        "--set", "train.eval_interval=0", "--set", "train.log_interval=1"]


def sheepop(*args: str) -> list[str]:
    return [sys.executable, "-m", "sheepop", *args]


def moment(run_dir: Path) -> str:
    """What a kill interrupted, from the state it left (read before any recovery)."""
    staging = run_dir / checkpoint.STAGING_DIR
    if not staging.exists():
        return "between saves"
    if (staging / checkpoint.COMMIT_FILE).exists():
        return "during a save after its commit"
    return "during a save before its commit"


def trial(data: Path, run_dir: Path, rng: random.Random, max_delay: float) -> tuple[str, str]:
    """One kill and resume: (the moment killed, "ok" or why the resume failed)."""
    child = subprocess.Popen(sheepop("train", str(data), "--out", str(run_dir), "--steps",
                                     "1000000", *TINY),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    while not (run_dir / checkpoint.TRAINER_JSON).exists():
        if child.poll() is not None:
            return "never started", child.stderr.read()[-300:]
        time.sleep(0.01)
    time.sleep(rng.uniform(0, max_delay))
    child.send_signal(signal.SIGKILL)
    child.wait()
    child.stderr.close()
    when = moment(run_dir)
    try:
        weights = read_run(run_dir)[2]  # generate's loader, with no recovery
        _, state = checkpoint.load_trainer_state(run_dir)
    except Exception as e:  # noqa: BLE001 - a benchmark counts every way it fails
        return when, f"reader refused: {e}"
    step = int(state["step"])
    resumed = subprocess.run(sheepop("train", str(data), "--resume", "--out", str(run_dir),
                                     "--steps", str(step + 1), *TINY),
                             capture_output=True, text=True, timeout=300)
    if resumed.returncode != 0:
        return when, f"resume refused: {resumed.stderr.strip()[-300:]}"
    said = re.search(r"resuming .* at step (\d+)", resumed.stdout + resumed.stderr)
    if not said or int(said.group(1)) != step:
        return when, f"resumed at {said and said.group(1)}, the reader saw step {step}"
    new = json.loads((run_dir / checkpoint.TRAINER_JSON).read_text())["step"]
    if new != step + 1 or not weights:
        return when, f"after the resume trainer.json says step {new}, not {step + 1}"
    return when, "ok"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-delay", type=float, default=1.0)
    parser.add_argument("--progress", action="store_true", help="a line after each trial")
    args = parser.parse_args()
    print(machine.summary(), flush=True)
    rng = random.Random(args.seed)
    moments, failures = Counter(), []
    root = Path(tempfile.mkdtemp(prefix="kill_resume."))
    data = root / "text.txt"
    data.write_text("hello world, hello sheep. the quick brown fox jumps. " * 400)
    start = time.perf_counter()
    try:
        for i in range(args.trials):
            run_dir = root / f"run{i}"
            when, outcome = trial(data, run_dir, rng, args.max_delay)
            moments[when] += 1
            if outcome != "ok":
                failures.append(f"trial {i} ({when}): {outcome}")
            if args.progress:
                print(f"trial {i + 1}: killed {when}, {outcome} ({len(failures)} refused so far)",
                      flush=True)
            shutil.rmtree(run_dir, ignore_errors=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"trials: {args.trials} in {time.perf_counter() - start:.0f} s "
          f"(seed {args.seed}, delay up to {args.max_delay:g} s)")
    for when in ("during a save before its commit", "during a save after its commit",
                 "between saves"):
        print(f"  killed {when}: {moments[when]}")
    print(f"resumed {args.trials - len(failures)} of {args.trials}; refused {len(failures)}")
    for line in failures:
        print("  " + line)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()

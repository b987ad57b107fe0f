"""`make run` as a newcomer types it, on a tiny model: the timestamped run, `runs/latest`
pointing at it (from the start, to follow the run), training's summary, a sample, then one block
of commands to go on, last, with the run's real path. `-o install` keeps make from reinstalling
into this venv."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
TRAIN_ARGS = ("--steps 2 --no-progress --set model.n_layer=1 --set model.n_head=2 "
              "--set model.n_embd=16 --set model.block_size=16 --set train.batch_size=2 "
              "--set train.eval_batches=1 --set train.threads=1 --set data.max_bytes=20000")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("make") is None or not (BIN / "sheepop").exists(),
                    reason="needs make and the sheepop script next to this Python")
def test_make_run_points_runs_latest_at_the_run_and_ends_with_what_to_do_next(tmp_path):
    runs = tmp_path / "runs"
    proc = subprocess.run(["make", "-s", "-C", str(ROOT), "-o", "install", "run",
                           f"VENV={BIN.parent}", f"RUNS={runs}", f"TRAIN_ARGS={TRAIN_ARGS}"],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (run,) = [p for p in runs.iterdir() if p.name != "latest"]
    assert re.fullmatch(r"cpu-\d{8}-\d{6}", run.name)
    assert os.readlink(runs / "latest") == run.name  # relative: the folder can move
    assert (runs / "latest" / "model.safetensors").is_file()
    assert (run / "best" / "model.safetensors").is_file()
    lines = proc.stdout.rstrip().splitlines()
    # the order a newcomer reads: the summary, the sample ("def " and what the model wrote
    # after it), the commands to go on, the line that says where the run is
    summary = lines.index(f"run saved in {run}")
    assert lines[summary + 1].startswith("def ") and lines.index("next:") > summary + 1, \
        proc.stdout
    assert lines[-1] == (f"the run: {run} (and {runs}/latest); for the commands after \"next:\" "
                         f"above, first . {BIN}/activate")
    # one block of advice (training's), and conversations that exist or a command that writes
    # them: no chats.jsonl out of nowhere
    assert lines.count("next:") == 1 and "chats.jsonl" not in proc.stdout
    block = lines[lines.index("next:") + 1:][:4]
    assert block[0] == f"  sheepop generate {run} --prompt 'def '    # --best: the best checkpoint"
    assert block[2].startswith("  sheepop finetune --demo    # writes conversations to "
                               "runs/finetune-demo/data/train.jsonl")
    assert block[3].startswith(f"  sheepop finetune {run} --data "
                               f"runs/finetune-demo/data/train.jsonl --out {run}-chat")

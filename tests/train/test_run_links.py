"""A run directory never reaches outside itself: `sheepop train --resume` on a run holding a
symbolic link (or a FIFO, or a link to /dev/zero) where one of its own files or folders belongs
exits 2 with one line naming it, and what the link points to is left byte for byte as it was.
Each case runs in a subprocess with a timeout, so a read that would block on a FIFO fails the
test instead of hanging it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from sheepop.cli import main
from sheepop.files import open_own_append

TINY = ["--engine", "numpy", "--no-progress", "--set", "model.n_layer=1",
        "--set", "model.n_embd=16", "--set", "model.n_head=2", "--set", "model.block_size=16",
        "--set", "train.batch_size=2", "--set", "train.checkpoint_interval=1",
        "--set", "train.eval_interval=1", "--set", "train.eval_batches=1",
        "--set", "train.keep_last=3", "--set", "train.threads=1"]
TIMEOUT_S = 60


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A run of 2 steps with a val split: best/ and checkpoints/ exist."""
    root = tmp_path_factory.mktemp("links")
    rng = np.random.default_rng(0)
    words = "the quick brown fox jumps over a lazy dog while seven sheep sleep".split()
    text = root / "text.txt"
    text.write_text(" ".join(rng.choice(words, 3000)))
    run = root / "run"
    assert main(["train", str(text), "--out", str(run), "--steps", "2", *TINY]) == 0
    assert (run / "best" / "model.safetensors").is_file()
    assert (run / "checkpoints" / "step-0000002").is_dir()
    return run


def _tree(path: Path) -> dict[str, bytes | str]:
    """Every file under `path` (or the file itself) with its bytes, and every folder."""
    if path.is_file():
        return {"": path.read_bytes()}
    return {str(p.relative_to(path)): (p.read_bytes() if p.is_file() else "folder")
            for p in sorted(path.rglob("*"))}


def _resume(run: Path) -> subprocess.CompletedProcess:
    try:
        return subprocess.run([sys.executable, "-m", "sheepop", "train", "--resume", "--out",
                               str(run), "--steps", "4", *TINY], capture_output=True,
                              text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"`train --resume` still running after {TIMEOUT_S} s (blocked on a FIFO?)")


def _outside_folder(tmp_path: Path, *names: str) -> Path:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "model.safetensors").write_bytes(b"the user's own model, not a run's")
    for name in names:  # what recovery or a save would delete in a run's own folder
        (outside / name).mkdir()
        (outside / name / "keep.txt").write_text("precious")
    return outside


def _copy(trained: Path, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(trained, run, symlinks=True)
    return run


def _refused(done: subprocess.CompletedProcess, *words: str) -> None:
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    line = done.stderr.strip()
    assert len(line.splitlines()) == 1 and line.startswith("sheepop: error: "), line
    for word in words:
        assert word in line, line


def test_best_linked_outside(tmp_path, trained):
    run = _copy(trained, tmp_path)
    outside = _outside_folder(tmp_path, ".checkpoint-staging")
    before = _tree(outside)
    shutil.rmtree(run / "best")
    (run / "best").symlink_to(outside)
    _refused(_resume(run), f"{run / 'best'} is a symbolic link")
    assert _tree(outside) == before


def test_checkpoints_linked_outside(tmp_path, trained):
    run = _copy(trained, tmp_path)
    outside = _outside_folder(tmp_path, ".step-0000001.tmp", "step-0000001")
    before = _tree(outside)
    shutil.rmtree(run / "checkpoints")
    (run / "checkpoints").symlink_to(outside)
    _refused(_resume(run), f"{run / 'checkpoints'} is a symbolic link")
    assert _tree(outside) == before


@pytest.mark.parametrize("name", ["train.lock", "metrics.jsonl", "model.safetensors",
                                  "trainer.json"])
def test_a_file_linked_outside(tmp_path, trained, name):
    run = _copy(trained, tmp_path)
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b'{"step": 1}\n' * 3)
    (run / name).unlink()
    (run / name).symlink_to(outside)
    _refused(_resume(run), f"{run / name} is a symbolic link")
    assert outside.read_bytes() == b'{"step": 1}\n' * 3


@pytest.mark.parametrize("name", ["train.lock", "metrics.jsonl"])
def test_a_fifo_is_refused_without_blocking(tmp_path, trained, name):
    run = _copy(trained, tmp_path)
    (run / name).unlink()
    os.mkfifo(run / name)
    _refused(_resume(run), f"{run / name} is a FIFO")


def test_a_lock_linked_to_dev_zero(tmp_path, trained):
    run = _copy(trained, tmp_path)
    (run / "train.lock").unlink()
    (run / "train.lock").symlink_to("/dev/zero")
    _refused(_resume(run), f"{run / 'train.lock'} is a symbolic link (to '/dev/zero')")


def test_a_run_directory_that_is_itself_a_link_still_resumes(tmp_path, trained):
    run = _copy(trained, tmp_path)
    alias = tmp_path / "alias"
    alias.symlink_to(run)
    done = _resume(alias)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "resuming" in done.stdout


def test_a_hard_linked_lock_is_refused_and_its_other_name_left_as_it_was(tmp_path, trained):
    """`ln OUTSIDE run/train.lock`: the lock's record was written into OUTSIDE."""
    run = _copy(trained, tmp_path)
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"the user's own notes\n")
    (run / "train.lock").unlink()
    os.link(outside, run / "train.lock")
    _refused(_resume(run), f"{run / 'train.lock'} has 2 names (a hard link")
    assert outside.read_bytes() == b"the user's own notes\n"


def test_a_hard_linked_metrics_file_is_appended_to_as_a_copy_of_its_own(tmp_path):
    """A metrics.jsonl with another name (linked while the run trains, or a `cp -al` backup):
    the row goes to the run's own copy, the other name keeps what it held."""
    path, backup = tmp_path / "metrics.jsonl", tmp_path / "backup.jsonl"
    path.write_text('{"step": 1}\n')
    os.link(path, backup)
    with open_own_append(path) as f:
        f.write('{"step": 2}\n')
    assert path.read_text() == '{"step": 1}\n{"step": 2}\n'
    assert backup.read_text() == '{"step": 1}\n'
    assert os.stat(path).st_nlink == 1 and os.stat(backup).st_nlink == 1

"""One writer per run directory (sheepop.train.run_lock), with real processes: a second
`sheepop train --out SAME`, fresh or --resume, exits 2 naming the holder; the lock dies with its
holder, even under kill -9, so a crashed run is resumed without any cleanup."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from processes import start_sheepop, wait_until

from sheepop.errors import UserError
from sheepop.train import run_lock

TINY = ["--engine", "numpy", "--no-progress", "--set", "model.n_layer=1",
        "--set", "model.n_embd=16", "--set", "model.n_head=2", "--set", "model.block_size=16",
        "--set", "train.batch_size=2", "--set", "train.checkpoint_interval=1",
        "--set", "train.eval_interval=0"]


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "text.txt"
    path.write_text("hello world, hello sheep. " * 200)
    return str(path)


def test_a_second_writer_is_refused_naming_the_first_until_it_dies(tmp_path, data):
    out = tmp_path / "run"
    first = start_sheepop(["train", data, "--out", str(out), "--steps", "1000000", *TINY])
    try:
        wait_until(first, (out / "trainer.json").exists, "the first checkpoint")
        record = json.loads((out / run_lock.LOCK_FILE).read_text())
        assert record["pid"] == first.pid
        for again in ([], ["--resume"]):
            second = subprocess.run([sys.executable, "-m", "sheepop", "train", data, "--out",
                                     str(out), "--steps", "5", *again, *TINY],
                                    capture_output=True, text=True, timeout=120)
            assert second.returncode == 2, second.stderr
            lines = second.stderr.strip().splitlines()
            assert len(lines) == 1 and "Traceback" not in second.stderr, second.stderr
            assert f"is in use by another training process (pid {first.pid} on " in lines[0]
            assert "python -m sheepop train" in lines[0] and f"since {record['since']}" in lines[0]
        assert first.poll() is None  # the first run was not disturbed
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    # kill -9 left the lock file but not the lock: --resume takes over, recovering the run.
    step = json.loads((out / "trainer.json").read_text())["step"]
    resumed = subprocess.run([sys.executable, "-m", "sheepop", "train", "--resume", data,
                              "--out", str(out), "--steps", str(step + 2), *TINY],
                             capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads((out / "trainer.json").read_text())["step"] == step + 2


def test_the_lock_is_released_when_the_run_ends_and_a_failed_start_leaves_nothing(tmp_path):
    lock = run_lock.acquire(tmp_path / "new")
    with pytest.raises(UserError, match="in use by another training process \\(pid "
                                        f"{os.getpid()}"):
        run_lock.acquire(tmp_path / "new")  # one writer, even within one process
    lock.release(undo=True)
    assert not (tmp_path / "new").exists()
    run_lock.acquire(tmp_path / "new").release()
    assert (tmp_path / "new" / run_lock.LOCK_FILE).exists()
    run_lock.acquire(tmp_path / "new").release()


def test_check_free_names_the_holder_and_creates_nothing(tmp_path):
    run_lock.check_free(tmp_path / "nothing")  # no directory: free
    assert not (tmp_path / "nothing").exists()
    lock = run_lock.acquire(tmp_path / "r")
    with pytest.raises(UserError, match=f"in use by another training process \\(pid {os.getpid()}"):
        run_lock.check_free(tmp_path / "r")
    lock.release()
    run_lock.check_free(tmp_path / "r")  # released: free again

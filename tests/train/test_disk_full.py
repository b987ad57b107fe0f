"""A disk that really fills up during a save: a tmpfs mounted with room for one checkpoint but
not two (the new one is staged beside the old one). The save stops with one line naming the full
disk, the staged files are removed (the space is given back) and the previous checkpoint is
intact and resumable. Mounting needs root: without it the test is skipped, saying so; the fault
injector's ENOSPC at every write and fsync (test_checkpoint_crash.py) runs everywhere."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from sheepop.checkpoint import format as checkpoint
from sheepop.errors import UserError
from sheepop.inference.load import read_run

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _mount_tmpfs(path, size: int) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root (the injected-ENOSPC tests still run)")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip()}); the injected-ENOSPC "
                    "tests still run")


def test_a_full_disk_stops_the_run_with_one_line_and_keeps_the_checkpoint(
        tmp_path, tiny_config, tiny_trainer):
    def cfg(steps):
        return tiny_config(steps=steps, checkpoint_interval=1, eval_interval=0, log_interval=1)

    probe = tmp_path / "probe"
    tiny_trainer(cfg(1), probe).run()
    one = sum(p.stat().st_size for p in probe.iterdir() if p.is_file())  # (not best/)
    disk = tmp_path / "disk"
    disk.mkdir()
    _mount_tmpfs(disk, (one * 3 // 2) // 4096 * 4096 + 4096)
    try:
        run_dir = disk / "run"
        trainer = tiny_trainer(cfg(50), run_dir)
        with pytest.raises(UserError) as e:
            trainer.run()
        message = str(e.value)
        assert "\n" not in message and "(the disk is full)" in message, message
        assert "the checkpoint of step 1 is intact" in message, message
        assert "--resume --out" in message
        assert not (run_dir / checkpoint.STAGING_DIR).exists()  # the space was given back
        assert checkpoint.load_trainer_state(run_dir)[1]["step"] == 1
        weights = read_run(run_dir)[2]
        resumed = tiny_trainer(cfg(50), run_dir, resume=True)  # loads, even on the full disk
        assert resumed.step == 1
        resumed.run_lock.release()
        shutil.copytree(run_dir, tmp_path / "moved")  # room again: it continues
    finally:
        subprocess.run(["umount", str(disk)], check=True)
    resumed = tiny_trainer(cfg(3), tmp_path / "moved", resume=True)
    assert all((resumed.engine.weights()[k] == w).all() for k, w in weights.items())
    resumed.run()
    assert checkpoint.load_trainer_state(tmp_path / "moved")[1]["step"] == 3

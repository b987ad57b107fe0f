"""The checkpoint save is all or nothing (sheepop.checkpoint.commit: stage, commit, install): the
state a crash can leave at each point of the protocol, and what recovery and readers make of it.
Crashes injected at every file operation of a real save are in tests/train/
test_checkpoint_crash.py."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from sheepop.checkpoint import format as checkpoint
from sheepop.checkpoint.commit import COMMIT_FILE, STAGING_DIR
from sheepop.errors import UserError
from sheepop.files import atomic_write_bytes

FILES = sorted(checkpoint.CHECKPOINT_FILES)


def _save(run_dir, value: float, step: int) -> None:
    weights = {"w": np.full((3, 4), value, dtype=np.float32)}
    checkpoint.save_checkpoint(run_dir, weights, {"model": {"n_layer": 1}}, '{"tok": 1}',
                               {"m": np.full(4, value)}, {"step": step})


def _staged_but_not_installed(run_dir, value: float, step: int, commit: bool) -> None:
    """run_dir as a crash leaves it after staging step `step` (and its commit record when
    `commit`), before any file was moved into place."""
    scratch = run_dir.parent / "scratch"
    _save(scratch, value, step)
    staging = run_dir / STAGING_DIR
    staging.mkdir()
    for name in FILES:
        shutil.copy(scratch / name, staging / name)
    if commit:
        (staging / COMMIT_FILE).write_text(json.dumps(
            {"format": "sheepop-checkpoint-commit", "version": 1,
             "files": {name: "" for name in FILES}}))
    shutil.rmtree(scratch)


def _step(run_dir) -> int:
    return checkpoint.load_trainer_state(run_dir)[1]["step"]


def test_a_save_leaves_the_five_files_and_nothing_else(tmp_path):
    _save(tmp_path / "run", 1.0, 1)
    _save(tmp_path / "run", 2.0, 2)
    assert sorted(os.listdir(tmp_path / "run")) == FILES
    assert _step(tmp_path / "run") == 2
    assert checkpoint.load_weights(tmp_path / "run")["w"][0, 0] == 2.0


def test_a_committed_save_is_what_readers_see_and_what_recovery_installs(tmp_path):
    run = tmp_path / "run"
    _save(run, 1.0, 1)
    _staged_but_not_installed(run, 2.0, 2, commit=True)
    (run / STAGING_DIR / checkpoint.CONFIG_FILE).rename(run / checkpoint.CONFIG_FILE)  # moved
    # A reader (generate while training runs) reads the committed files, never a mix.
    assert checkpoint.load_weights(run)["w"][0, 0] == 2.0
    assert _step(run) == 2 and checkpoint.holds_checkpoint(run)
    checkpoint.recover(run)
    assert sorted(os.listdir(run)) == FILES
    assert _step(run) == 2 and checkpoint.load_weights(run)["w"][0, 0] == 2.0


def test_an_uncommitted_save_is_ignored_by_readers_and_deleted_by_recovery(tmp_path):
    run = tmp_path / "run"
    _save(run, 1.0, 1)
    _staged_but_not_installed(run, 2.0, 2, commit=False)
    assert _step(run) == 1 and checkpoint.load_weights(run)["w"][0, 0] == 1.0
    checkpoint.recover(run)
    assert sorted(os.listdir(run)) == FILES and _step(run) == 1


def test_a_first_save_that_never_committed_is_no_run(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    _staged_but_not_installed(run, 2.0, 2, commit=False)
    assert not checkpoint.holds_checkpoint(run)
    checkpoint.recover(run)
    assert os.listdir(run) == []


def test_recovery_removes_the_temporary_files_of_interrupted_atomic_writes(tmp_path):
    run = tmp_path / "run"
    _save(run, 1.0, 1)
    for name in (".model.safetensors.x1y2.tmp", ".metrics.jsonl.abc.tmp"):
        (run / name).write_bytes(b"half a file")
    kept = ["notes.tmp", ".notes.txt.x1.tmp"]  # not ours (--out a folder of the user's): kept
    for name in kept:
        (run / name).write_text("the user's")
    checkpoint.recover(run)
    assert sorted(os.listdir(run)) == sorted([*FILES, *kept])


def test_a_commit_record_cannot_move_other_files(tmp_path):
    run = tmp_path / "run"
    _save(run, 1.0, 1)
    staging = run / STAGING_DIR
    staging.mkdir()
    (tmp_path / "victim").write_text("keep me")
    (staging / COMMIT_FILE).write_text(json.dumps(
        {"format": "sheepop-checkpoint-commit", "version": 1, "files": {"../../victim": ""}}))
    checkpoint.recover(run)
    assert (tmp_path / "victim").read_text() == "keep me"
    assert sorted(os.listdir(run)) == FILES and _step(run) == 1


def test_a_run_written_file_by_file_by_an_older_sheepop_still_loads(tmp_path):
    run = tmp_path / "old"
    _save(tmp_path / "new", 3.0, 7)
    for name in FILES:  # the old layout: the same five files, each written atomically alone
        atomic_write_bytes(run / name, (tmp_path / "new" / name).read_bytes())
    checkpoint.recover(run)
    assert _step(run) == 7 and checkpoint.load_weights(run)["w"][1, 1] == 3.0


def test_a_refused_save_keeps_the_previous_checkpoint_and_says_why(tmp_path, monkeypatch):
    run = tmp_path / "run"
    _save(run, 1.0, 1)
    real_fsync = os.fsync

    def full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(checkpoint.SaveFailed, match="the disk is full.*previous checkpoint") as e:
        _save(run, 2.0, 2)
    assert not e.value.committed
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert sorted(os.listdir(run)) == FILES and _step(run) == 1  # staging removed: space freed
    assert isinstance(e.value, UserError)

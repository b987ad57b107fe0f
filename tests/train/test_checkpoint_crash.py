"""A crash at any moment of a save loses nothing: the fault injector (fault_injector.py) fails
each file operation of one real save in turn, by raising (an I/O error; a full disk) and by
killing the process there (os._exit in a forked child: no cleanup runs, as under kill -9).
After each fault, generate's loader reads a complete checkpoint even before any recovery, and
`--resume` (which recovers first) continues from the newest committed one: the step and every
weight are those of that checkpoint. The randomized kill -9 loop is test_kill_resume.py."""

from __future__ import annotations

import contextlib
import json
import os
import shutil

import numpy as np
import pytest
from fault_injector import Faults, exit_now, raise_disk_full

from sheepop.checkpoint import format as checkpoint
from sheepop.errors import UserError
from sheepop.inference.load import read_run

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@contextlib.contextmanager
def saving_under(faults: Faults):
    """checkpoint.save_checkpoint runs inside `faults` (and only it)."""
    real = checkpoint.save_checkpoint

    def save(*args, **kwargs):
        with faults:
            return real(*args, **kwargs)

    checkpoint.save_checkpoint = save
    try:
        yield
    finally:
        checkpoint.save_checkpoint = real


def _equal(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.fixture
def runs(tmp_path, tiny_config, tiny_trainer):
    """A run at step 2 (the template), and one clean save of step 3 from it: its operations,
    its arguments and its weights."""
    def trainer(run_dir, steps, resume=True):
        return tiny_trainer(tiny_config(steps=steps, checkpoint_interval=1), run_dir, resume)

    template = tmp_path / "template"
    trainer(template, 2, resume=False).run()
    shutil.copytree(template, tmp_path / "clean")
    counted, calls = Faults(), []
    with saving_under(counted):
        counting = checkpoint.save_checkpoint
        checkpoint.save_checkpoint = lambda *a, **k: (calls.append((a, k)), counting(*a, **k))[1]
        trainer(tmp_path / "clean", 3).run()
    weights = {2: checkpoint.load_weights(template), 3: checkpoint.load_weights(tmp_path / "clean")}
    return dict(template=template, trainer=trainer, log=counted.log, call=calls[0],
                commit=counted.index_of("replace", checkpoint.COMMIT_FILE), weights=weights)


def _check_recovers(run_dir, runs, expected_step: int) -> None:
    """Readers and --resume see the checkpoint of `expected_step`, whole; training goes on."""
    weights = runs["weights"][expected_step]
    assert _equal(read_run(run_dir)[2], weights)  # generate, before any recovery
    trainer = runs["trainer"](run_dir, expected_step + 1)
    assert trainer.step == expected_step
    assert _equal(trainer.engine.weights(), weights)
    assert not (run_dir / checkpoint.STAGING_DIR).exists() and not list(run_dir.glob(".*.tmp"))
    trainer.run()
    assert json.loads((run_dir / "trainer.json").read_text())["step"] == expected_step + 1
    assert _equal(read_run(run_dir)[2], checkpoint.load_weights(run_dir))


def test_one_save_is_a_few_dozen_file_operations_with_one_commit(runs):
    names = [name for name, _ in runs["log"]]
    assert 30 <= len(names) <= 80, names
    assert names.count("fsync") >= 8  # each staged file, the commit record, the folders
    assert names[runs["commit"]] == "replace"


def test_an_error_at_any_file_operation_keeps_a_complete_checkpoint(tmp_path, runs):
    n, outcomes = len(runs["log"]), {2: 0, 3: 0}
    for k in range(n + 1):
        run_dir = tmp_path / f"k{k}"
        shutil.copytree(runs["template"], run_dir)
        trainer = runs["trainer"](run_dir, 3)
        try:
            with saving_under(Faults(at=k)):
                trainer.run()
            raised = False
        except UserError as e:
            assert "saving the checkpoint of step 3" in str(e) and "failed" in str(e), str(e)
            raised = True
        assert raised == (k < n), k
        expected = 3 if k > runs["commit"] else 2
        outcomes[expected] += 1
        _check_recovers(run_dir, runs, expected)
    assert outcomes == {2: runs["commit"] + 1, 3: n - runs["commit"]}


def test_a_kill_at_any_file_operation_keeps_a_complete_checkpoint(tmp_path, runs):
    (_, *rest), kwargs = runs["call"]
    n = len(runs["log"])
    for k in range(n + 1):
        run_dir = tmp_path / f"k{k}"
        shutil.copytree(runs["template"], run_dir)
        pid = os.fork()
        if pid == 0:  # the child saves step 3 and dies at operation k
            try:
                with Faults(at=k, action=exit_now):
                    checkpoint.save_checkpoint(run_dir, *rest, **kwargs)
            finally:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == (77 if k < n else 0), k
        _check_recovers(run_dir, runs, 3 if k > runs["commit"] else 2)


def test_a_full_disk_at_any_write_says_so_and_keeps_the_previous_checkpoint(tmp_path, runs):
    writes = [k for k, (name, _) in enumerate(runs["log"]) if name in ("write", "writev", "fsync")]
    assert len(writes) >= 13
    for k in writes:
        run_dir = tmp_path / f"k{k}"
        shutil.copytree(runs["template"], run_dir)
        trainer = runs["trainer"](run_dir, 3)
        with saving_under(Faults(at=k, action=raise_disk_full)), \
                pytest.raises(UserError) as e:
            trainer.run()
        committed = k > runs["commit"]
        assert "(the disk is full)" in str(e.value)
        assert ("step 3 is committed" if committed else "step 2 is intact") in str(e.value)
        assert not (run_dir / checkpoint.STAGING_DIR).exists() or committed  # space freed
        _check_recovers(run_dir, runs, 3 if committed else 2)

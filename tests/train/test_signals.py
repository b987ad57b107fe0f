"""Real signals sent to the training loop: Ctrl-C (SIGINT), SIGTERM and SIGHUP stop it at a step
boundary, the step they arrive in is finished (never torn) and saved, a resume continues bit for
bit, and signals arriving during the save wait for it (sheepop.train.signals)."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading

import numpy as np
import pytest
from safetensors.numpy import load_file

from sheepop.train import signals

STOP = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP]


def _signal_during_optimizer_update(trainer, at_step: int, signum: int, times: int = 1) -> None:
    """Send `signum` to this process as step `at_step`'s AdamW update begins (its forward and
    backward done, no weight changed yet): a signal that raised there would tear the step."""
    optimizer = trainer.engine.optimizer
    real_step, seen = optimizer.step, []

    def step(*args, **kwargs):
        seen.append(1)
        if len(seen) == at_step:
            for _ in range(times):
                os.kill(os.getpid(), signum)  # the handler runs here, at the next bytecode
        return real_step(*args, **kwargs)

    optimizer.step = step


def _weights(run_dir):
    return load_file(run_dir / "model.safetensors")


@pytest.mark.parametrize("signum", STOP, ids=lambda s: signal.Signals(s).name)
def test_a_signal_mid_step_finishes_the_step_saves_it_and_resumes_exactly(
        tmp_path, tiny_config, tiny_trainer, read_metrics, signum):
    straight = tiny_trainer(tiny_config(), tmp_path / "straight")
    straight.run()
    first = tiny_trainer(tiny_config(), tmp_path / "run")
    term_before = signal.getsignal(signal.SIGTERM)
    _signal_during_optimizer_update(first, 6, signum)
    summary = first.run()
    assert summary.interrupted and summary.steps == 6 and summary.signum == signum
    assert json.loads((tmp_path / "run" / "trainer.json").read_text())["step"] == 6
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == list(range(1, 7))
    assert signal.getsignal(signal.SIGTERM) == term_before  # the run's handlers are gone
    resumed = tiny_trainer(tiny_config(), tmp_path / "run", resume=True)
    assert resumed.step == 6
    assert not resumed.run().interrupted
    a, b = read_metrics(tmp_path / "straight"), read_metrics(tmp_path / "run")
    assert [r["step"] for r in b] == list(range(1, 13))
    for row in (*a, *b):
        del row["tokens_per_sec"]
    assert a == b  # losses, gradient norms, validation losses: identical
    wa, wb = _weights(tmp_path / "straight"), _weights(tmp_path / "run")
    assert all(np.array_equal(wa[k], wb[k]) for k in wa)  # bit for bit, dropout on


def test_ctrl_c_twice_during_the_save_waits_for_it(tmp_path, tiny_config, tiny_trainer,
                                                   monkeypatch, read_metrics):
    """Ctrl-C mid-step, then two more inside the checkpoint's fsync calls: no exception, the
    save completes, the checkpoint is the interrupted step's."""
    trainer = tiny_trainer(tiny_config(steps=50), tmp_path / "run")
    _signal_during_optimizer_update(trainer, 3, signal.SIGINT)
    real_fsync, calls = os.fsync, []

    def fsync(fd):
        calls.append(fd)
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    summary = trainer.run()
    assert calls, "the save did not fsync"
    assert summary.interrupted and summary.steps == 3 and summary.signum == signal.SIGINT
    monkeypatch.undo()
    resumed = tiny_trainer(tiny_config(steps=50), tmp_path / "run", resume=True)
    assert resumed.step == 3  # the checkpoint is complete and consistent
    assert [r["step"] for r in read_metrics(tmp_path / "run")] == [1, 2, 3]


def test_signals_during_the_final_save_of_a_finished_run_change_nothing(
        tmp_path, tiny_config, tiny_trainer, monkeypatch):
    trainer = tiny_trainer(tiny_config(steps=3), tmp_path / "run")
    real_fsync, calls = os.fsync, []

    def fsync(fd):
        calls.append(fd)
        if len(calls) <= 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    summary = trainer.run()
    assert not summary.interrupted and summary.steps == 3
    assert json.loads((tmp_path / "run" / "trainer.json").read_text())["step"] == 3


def test_outside_the_loop_sigterm_raises_like_ctrl_c():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt) as caught:
        with signals.raising_stop_signals():
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):  # the handler runs at the next bytecode
                pass
    assert signals.signum_of(caught.value) == signal.SIGTERM
    assert signals.exit_status(signals.signum_of(caught.value)) == 143
    assert signals.exit_status(signal.SIGHUP) == 129 and signals.exit_status(None) == 130
    assert signal.getsignal(signal.SIGTERM) == before


def _dropped_by_a_finaliser(signum: int) -> None:
    """`signum` handled inside a generator the collector closes: Python drops what the handler
    raises there ("Exception ignored in", here quiet: sheepop.train.signals)."""
    def generator():
        try:
            yield
        finally:
            signal.pthread_kill(threading.main_thread().ident, signum)  # the handler runs here
    started = generator()
    next(started)
    del started


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP],
                         ids=lambda s: signal.Signals(s).name)
def test_a_stop_signal_dropped_before_the_loop_stops_it_at_its_first_step(
        tmp_path, tiny_config, tiny_trainer, signum, monkeypatch):
    """(A signal dropped while the trainer is set up stops it as soon as its engine is built:
    `signals.deferred`, tests/cli/test_signal_edges.py.)"""
    reported = []
    monkeypatch.setattr(sys, "unraisablehook", reported.append)
    trainer = tiny_trainer(tiny_config(), tmp_path / "run")
    with signals.raising_stop_signals():
        _dropped_by_a_finaliser(signum)  # e.g. while the command imports torch
        assert reported == []  # not a traceback: the command line says it in one line
        summary = trainer.run()
    assert summary.interrupted and summary.steps == 1 and summary.signum == signum
    assert json.loads((tmp_path / "run" / "trainer.json").read_text())["step"] == 1
    assert signals.unheard() is None  # taken by the loop: the command line says nothing more


def test_a_stop_signal_caught_by_sheepop_is_heard_and_one_dropped_is_not():
    with pytest.raises(KeyboardInterrupt):
        with signals.raising_stop_signals():
            signal.raise_signal(signal.SIGTERM)
    assert signals.unheard() is None  # it left the block: the caller above catches it
    with signals.raising_stop_signals():
        try:
            signal.raise_signal(signal.SIGHUP)
        except KeyboardInterrupt as e:
            assert signals.heard(e) == signal.SIGHUP  # e.g. chat stopping an answer
        assert signals.unheard() is None
        _dropped_by_a_finaliser(signal.SIGHUP)
    assert signals.unheard() == signal.SIGHUP and signals.unheard() is None  # taken once

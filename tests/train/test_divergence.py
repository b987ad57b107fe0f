"""A diverging run stops before it saves (sheepop.train.divergence): the checkpoint on disk is
the last good one, finite and exactly what was saved before, and the one-line message says
what happened, at which step and how to continue."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from sheepop.checkpoint import format as checkpoint
from sheepop.cli import main
from sheepop.config.build import build_config
from sheepop.config.schema import TrainConfig
from sheepop.errors import UserError
from sheepop.train import divergence

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _recording_saves(monkeypatch) -> list[dict[str, np.ndarray]]:
    """The weights of every save that went through, in order."""
    saved, real = [], checkpoint.save_checkpoint

    def save(run_dir, weights, *args, **kwargs):
        real(run_dir, weights, *args, **kwargs)
        saved.append({k: np.array(v, dtype=np.float32) for k, v in weights.items()})

    monkeypatch.setattr(checkpoint, "save_checkpoint", save)
    return saved


@pytest.mark.parametrize("limit, stop_step, why", [
    (1000.0, 4, "the gradient norm reached 5053, past train.max_grad_norm=1000"),
    (0.0, 9, "the loss became nan"),  # no limit: the NaN still stops it before a save
])
def test_a_huge_learning_rate_stops_before_saving_and_keeps_the_last_good_checkpoint(
        tmp_path, tiny_config, tiny_trainer, monkeypatch, limit, stop_step, why):
    saved = _recording_saves(monkeypatch)
    cfg = tiny_config(steps=200, lr=100.0, eval_interval=0, checkpoint_interval=1,
                      max_grad_norm=limit)
    trainer = tiny_trainer(cfg, tmp_path / "run")
    with pytest.raises(UserError) as e:
        trainer.run()
    message = str(e.value)
    assert f"training diverged at step {stop_step}: {why}" in message
    # A save is written only once the step after it is sound: step stop_step - 1 led to the
    # divergence, so the checkpoint kept is the one before it.
    kept = stop_step - 2
    assert (f"is still that of step {kept} (its next step was sound): continue from it with a "
            f"lower learning rate, e.g. `sheepop train --resume --out {tmp_path / 'run'} --set "
            "train.lr=10`" in message)
    assert len(saved) == kept
    on_disk = checkpoint.load_weights(tmp_path / "run")
    assert all(np.isfinite(w).all() for w in on_disk.values())
    assert all(np.array_equal(on_disk[k], saved[-1][k]) for k in on_disk)
    assert checkpoint.load_trainer_state(tmp_path / "run")[1]["step"] == kept
    # Its next step was sound at lr 100, and the norm a step measures does not depend on the
    # learning rate, so a lower one passes that step; but lr 100 from the start had already
    # taken the weights from norm 9 to 1.4e4 by step 2: the resume diverges again a little
    # later, and the message then names the way that works, a new run.
    resumed = tiny_trainer(tiny_config(steps=kept + 4, lr=1e-3, checkpoint_interval=1,
                                       max_grad_norm=limit), tmp_path / "run", resume=True)
    assert resumed.step == kept
    if limit:
        with pytest.raises(UserError, match=r"start a new run \(another --out\) with a lower "):
            resumed.run()
        assert checkpoint.load_trainer_state(tmp_path / "run")[1]["step"] == kept
    else:  # no limit: only finiteness is guarded, and step 7's weights stay finite at lr 1e-3
        resumed.run()
        assert checkpoint.load_trainer_state(tmp_path / "run")[1]["step"] == kept + 4


def test_the_interrupt_path_never_saves_weights_that_are_not_finite(tmp_path, tiny_config,
                                                                   tiny_trainer, monkeypatch):
    saved = _recording_saves(monkeypatch)
    trainer = tiny_trainer(tiny_config(steps=50, checkpoint_interval=2), tmp_path / "run")
    real_step, calls = trainer.engine.train_step, []

    def step(micro, lr):
        calls.append(lr)
        if len(calls) == 6:
            raise KeyboardInterrupt  # as Ctrl-C: the final save runs
        result = real_step(micro, lr)
        if len(calls) == 5:  # weights ruined, yet the step reports nothing wrong
            with torch.no_grad():
                next(trainer.engine.model.parameters()).fill_(math.nan)
        return result

    trainer.engine.train_step = step
    with pytest.raises(UserError, match="diverged at step 5: the weights are no longer finite"
                                        ".* still that of step 4"):
        trainer.run()
    assert len(saved) == 2
    assert checkpoint.load_trainer_state(tmp_path / "run")[1]["step"] == 4


def test_a_diverged_run_exits_2_with_one_line(tmp_path, capsys):
    data = tmp_path / "text.txt"
    data.write_text("hello world, hello sheep. " * 200)
    code = main(["train", str(data), "--out", str(tmp_path / "run"), "--steps", "50",
                 "--no-progress", "--set", "model.n_layer=1", "--set", "model.n_embd=16",
                 "--set", "model.n_head=2", "--set", "model.block_size=16",
                 "--set", "train.batch_size=2", "--set", "train.lr=1000",
                 "--set", "train.warmup_steps=0", "--set", "train.checkpoint_interval=1"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("sheepop: error:")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    # Step 1's update (lr 1000, no warmup) made step 2's gradient NaN: step 1 is not kept,
    # and the advice is a new run, not a --resume that would start from those weights.
    assert "training diverged at step 2" in lines[0], lines[0]
    assert "no checkpoint was saved, so start again with a lower train.lr" in lines[0]
    assert not (tmp_path / "run" / "trainer.json").exists()


def test_what_counts_as_diverging():
    cfg = TrainConfig(max_grad_norm=100.0)
    assert divergence.problem(2.5, 99.0, cfg) is None
    assert divergence.problem(2.5, 101.0, cfg).startswith("the gradient norm reached 101")
    assert divergence.problem(math.inf, 1.0, cfg) == "the loss became inf"
    assert divergence.problem(2.5, math.nan, cfg) == "the gradient norm became nan"
    assert divergence.problem(2.5, 1e30, TrainConfig(max_grad_norm=0.0)) is None  # no limit
    # float16's loss scaler skips a step with an infinite gradient: routine, not divergence.
    assert divergence.problem(2.5, math.inf, TrainConfig(dtype="float16")) is None
    with pytest.raises(UserError, match="train.max_grad_norm must be >= 0"):
        build_config(None, None, ["train.max_grad_norm=-1"]).validate()

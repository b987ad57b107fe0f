"""What a run keeps: the best model in best/ (loadable by generate and eval with --best), the
newest train.keep_last checkpoints in checkpoints/, early stopping after
train.early_stop_patience evaluations without a new best; a resumed run keeps its model
(sheepop.train.keeping, sheepop.train.same_model)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sheepop.checkpoint import format as checkpoint
from sheepop.cli import main
from sheepop.errors import UserError
from sheepop.train.keeping import read_best

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _scripted(trainer, losses):
    """The trainer's evaluations return these val losses in turn (bits per byte: none)."""
    it = iter(losses)
    trainer.evaluate = lambda: (next(it), None)


def _equal(a, b) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_best_is_the_model_of_the_lowest_val_loss_and_keep_last_the_newest(
        tmp_path, tiny_config, tiny_trainer, read_metrics, capsys):
    run = tmp_path / "run"
    trainer = tiny_trainer(tiny_config(checkpoint_interval=4, keep_last=2), run)
    _scripted(trainer, [2.0, 1.5, 1.7])  # evaluations at steps 4, 8, 12: the best is step 8
    summary = trainer.run()
    assert (summary.best_step, summary.best_val) == (8, 1.5)
    assert summary.lines()[2] == (f"best val loss 1.5000 at step 8, kept in {run / 'best'} "
                                  "(generate, chat, eval and serve load it with --best)")
    assert read_best(run / "best") == {"format": "sheepop-best", "version": 1, "step": 8,
                                       "val_loss": 1.5, "val_bpb": None}
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == \
        ["step-0000008", "step-0000012"]  # keep_last=2 of the checkpoints at 4, 8, 12
    kept = run / "checkpoints" / "step-0000008"
    assert _equal(checkpoint.load_weights(run / "best"), checkpoint.load_weights(kept))
    assert not _equal(checkpoint.load_weights(run / "best"), checkpoint.load_weights(run))
    assert json.loads((kept / "trainer.json").read_text())["step"] == 8
    latest = (run / "model.safetensors").stat()
    copy = (run / "checkpoints" / "step-0000012" / "model.safetensors").stat()
    assert (copy.st_ino, copy.st_nlink) == (latest.st_ino, 2)  # a hard link: no space spent
    state = json.loads((run / "trainer.json").read_text())
    assert (state["best_val_loss"], state["best_step"], state["evals_since_best"]) == (1.5, 8, 1)
    # generate and eval load best/ with --best, and say which it is
    assert main(["generate", str(run), "--best", "--prompt", "the", "--max-new-tokens", "3",
                 "--temperature", "0"]) == 0
    err = capsys.readouterr().err
    assert f"sheepop: the best checkpoint of {run}: step 8, val loss 1.5000 ({run / 'best'})" \
        in err
    (tmp_path / "text.txt").write_text("the quick brown fox jumps over the lazy dog. " * 3)
    assert main(["eval", str(run), "--best", "--data", str(tmp_path / "text.txt"),
                 "--json"]) == 0
    out = capsys.readouterr()
    assert "step 8" in out.err and json.loads(out.out)["windows"] > 0


def test_a_run_without_a_best_checkpoint_is_one_line(tmp_path, tiny_config, tiny_trainer,
                                                     interrupt_after, capsys):
    trainer = tiny_trainer(tiny_config(), tmp_path / "run")
    interrupt_after(trainer, 2)  # before the first evaluation: no best/
    trainer.run()
    assert main(["generate", str(tmp_path / "run"), "--best"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"sheepop: error: {tmp_path / 'run'} has no best checkpoint (best/ is "
                          "written at each evaluation that lowers the val loss")


def test_early_stopping_after_patience_evaluations_without_a_new_best(
        tmp_path, tiny_config, tiny_trainer, read_metrics):
    run = tmp_path / "run"
    trainer = tiny_trainer(tiny_config(steps=40, eval_interval=2, early_stop_patience=2), run)
    _scripted(trainer, [2.0, 1.5, 1.6, 1.55, 1.0])  # steps 2, 4, 6, 8: two without a best
    summary = trainer.run()
    assert summary.steps == 8 and summary.stopped_early == 2 and not summary.interrupted
    lines = summary.lines()
    assert lines[0].startswith("stopped early at step 8 in ")
    assert lines[2] == ("stopped early: 2 evaluations in a row without a new best val loss "
                        "(train.early_stop_patience)")
    assert read_best(run / "best")["step"] == 4
    assert json.loads((run / "trainer.json").read_text())["step"] == 8
    assert read_metrics(run)[-1]["step"] == 8


def test_patience_counts_across_a_resume(tmp_path, tiny_config, tiny_trainer, interrupt_after):
    run = tmp_path / "run"
    first = tiny_trainer(tiny_config(steps=40, eval_interval=2, early_stop_patience=2), run)
    _scripted(first, [2.0, 2.5])
    interrupt_after(first, 4)
    first.run()
    resumed = tiny_trainer(tiny_config(steps=40, eval_interval=2, early_stop_patience=2), run,
                           resume=True)
    _scripted(resumed, [2.2])  # the second evaluation in a row without a new best
    assert resumed.run().steps == 6


def test_resuming_with_another_model_size_is_refused_in_words(tmp_path, tiny_config,
                                                              tiny_trainer):
    run = tmp_path / "run"
    tiny_trainer(tiny_config(steps=2), run).run()
    cfg = tiny_config(steps=4)
    cfg.model.n_layer, cfg.model.n_embd = 3, 32
    with pytest.raises(UserError) as e:
        tiny_trainer(cfg, run, resume=True)
    assert str(e.value) == ("--resume: the run has 2 layers, the config asks for 3 "
                            "(model.n_layer); the run has width 16, the config asks for 32 "
                            "(model.n_embd): a run keeps its model (start a new run with another "
                            "--out to train a different one)")
    cfg = tiny_config(steps=4)
    cfg.model.activation, cfg.model.dropout, cfg.model.block_size = "relu", 0.0, 32
    with pytest.raises(UserError, match=r"the run has activation = 'gelu', the config asks for "
                                        r"'relu' \(model.activation\): a run keeps"):
        tiny_trainer(cfg, run, resume=True)
    cfg.model.activation = "gelu"  # dropout and (sinusoidal) block_size may change
    assert tiny_trainer(cfg, run, resume=True).run().steps == 4


def test_recovery_drops_a_torn_best_and_a_half_made_copy(tmp_path, tiny_config, tiny_trainer):
    run = tmp_path / "run"
    tiny_trainer(tiny_config(steps=4), run).run()
    best = checkpoint.load_weights(run / "best")
    (run / "best" / checkpoint.STAGING_DIR).mkdir()  # a best save killed before its commit
    (run / "best" / checkpoint.STAGING_DIR / "model.safetensors").write_bytes(b"torn")
    (run / "checkpoints" / ".step-0000004.tmp").mkdir(parents=True)
    checkpoint.recover(run)
    assert not (run / "best" / checkpoint.STAGING_DIR).exists()
    assert not list((run / "checkpoints").iterdir())
    assert _equal(checkpoint.load_weights(run / "best"), best)

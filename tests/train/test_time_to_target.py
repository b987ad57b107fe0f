"""Time to a target loss: train.target_val_loss stops the run at the first evaluation at or below
it and the summary says at which step and second; --val-data validates on a held-out file (all
of DATA then trains), and --resume keeps validating on it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sheepop.cli import main
from sheepop.config.schema import DataConfig
from sheepop.data.dataset import encode_documents, load_dataset
from sheepop.errors import UserError

TINY = ["--no-progress", "--set", "model.n_layer=1", "--set", "model.n_head=2",
        "--set", "model.n_embd=16", "--set", "model.block_size=16", "--set", "train.batch_size=2",
        "--set", "train.log_interval=1", "--set", "train.eval_interval=2",
        "--set", "train.eval_batches=1", "--set", "train.threads=1",
        "--set", "train.warmup_steps=1"]
TRAIN_TEXT = "the quick brown fox jumps over a lazy dog while seven sheep sleep " * 40
VAL_TEXT = "a lazy dog sleeps; the quick sheep jump over seven brown foxes " * 8


def test_the_run_stops_at_the_first_evaluation_that_reaches_the_target(
        tmp_path, tiny_config, tiny_trainer, read_metrics):
    first = tiny_trainer(tiny_config(steps=12, dropout=0.0), tmp_path / "probe")
    first.run()
    losses = [r["val_loss"] for r in read_metrics(tmp_path / "probe") if "val_loss" in r]
    assert losses[1] < losses[0]  # evaluations at steps 4, 8, 12
    # a target between the first and the second evaluation's loss: reached at step 8
    target = (losses[0] + losses[1]) / 2
    summary = tiny_trainer(tiny_config(steps=12, dropout=0.0, target_val_loss=target),
                           tmp_path / "run").run()
    assert summary.steps == 8 and summary.reached[0] == 8 and summary.reached[1] > 0
    lines = summary.lines()
    assert lines[0].startswith("reached the target at step 8 in ")
    assert f"target val loss {target:g}: reached at step 8, after " in lines[2]
    assert [r["step"] for r in read_metrics(tmp_path / "run")][-1] == 8


def test_a_target_not_reached_is_said(tmp_path, tiny_config, tiny_trainer):
    summary = tiny_trainer(tiny_config(steps=8, target_val_loss=0.001), tmp_path / "run").run()
    assert summary.steps == 8 and summary.reached is None
    assert "target val loss 0.001: not reached" in summary.lines()


def test_val_data_replaces_the_split(tmp_path):
    data, held_out = tmp_path / "train.txt", tmp_path / "val.txt"
    data.write_text(TRAIN_TEXT)
    held_out.write_text(VAL_TEXT)
    split = load_dataset(data, DataConfig())
    whole = load_dataset(data, DataConfig(val_data=str(held_out)), split.tokenizer)
    assert len(whole.train) == len(split.train) + len(split.val)  # all of DATA trains
    np.testing.assert_array_equal(whole.val, encode_documents(split.tokenizer, [VAL_TEXT]))
    assert any(line.startswith("validation data: ") for line in whole.report)


def test_val_data_that_encodes_to_nothing_is_refused(tmp_path):
    (tmp_path / "train.txt").write_text(TRAIN_TEXT)
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(UserError):
        load_dataset(tmp_path / "train.txt", DataConfig(val_data=str(tmp_path / "empty.txt")))


def test_train_with_val_data_and_a_target_from_the_command_line(tmp_path, capsys):
    data, held_out, run = tmp_path / "train.txt", tmp_path / "val.txt", tmp_path / "run"
    data.write_text(TRAIN_TEXT)
    held_out.write_text(VAL_TEXT)
    assert main(["train", str(data), "--out", str(run), "--steps", "4", "--val-data",
                 str(held_out), "--target-val-loss", "0.5", *TINY]) == 0
    out = capsys.readouterr()
    assert "target val loss 0.5: not reached" in out.out + out.err
    saved = json.loads((run / "config.json").read_text())
    assert saved["data"]["val_data"] == str(held_out)
    assert saved["train"]["target_val_loss"] == 0.5
    # --resume validates on the same file (data.val_data is in the run's config)
    assert main(["train", "--resume", "--out", str(run), "--steps", "6", *TINY]) == 0
    out = capsys.readouterr()
    assert any(line.startswith("validation data: ") and line.endswith(f"from {held_out}; "
               "skipped: none") for line in (out.out + out.err).splitlines())


def test_a_relative_val_data_is_recorded_absolute(tmp_path, monkeypatch):
    (tmp_path / "train.txt").write_text(TRAIN_TEXT)
    (tmp_path / "val.txt").write_text(VAL_TEXT)
    monkeypatch.chdir(tmp_path)
    assert main(["train", "train.txt", "--out", "run", "--steps", "2", "--val-data", "val.txt",
                 *TINY]) == 0
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["data"]["val_data"] == str(tmp_path / "val.txt")

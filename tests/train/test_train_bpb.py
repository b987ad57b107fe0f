"""Validation bits per byte in training: `val_bpb` in metrics.jsonl at every evaluation and in
the end-of-run summary, from the bytes of exactly the validation targets scored."""

import math

import numpy as np
import pytest

from sheepop.data.dataset import Dataset
from sheepop.tokenizers import train_tokenizer
from sheepop.train.start import setup

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny models: see tests/conftest.py


def test_ascii_char_run_logs_val_bpb_equal_to_val_loss_over_ln2(tmp_path, tiny_config,
                                                                 tiny_trainer, read_metrics):
    trainer = tiny_trainer(tiny_config(steps=4, eval_interval=2, dropout=0.0), tmp_path / "run")
    assert trainer.eval_bytes == int((trainer.eval_y != -1).sum())  # ASCII: one byte a target
    summary = trainer.run()
    evaluated = [r for r in read_metrics(tmp_path / "run") if "val_loss" in r]
    assert [r["step"] for r in evaluated] == [2, 4]
    for r in evaluated:
        assert r["val_bpb"] == pytest.approx(r["val_loss"] / math.log(2), rel=1e-6)
    assert summary.val_bpb == pytest.approx(evaluated[-1]["val_bpb"], rel=1e-6)
    assert f"{summary.val_bpb:.4f} bits/byte)" in summary.lines()[1]


def test_multibyte_validation_text_divides_by_its_utf8_bytes(tmp_path, tiny_config,
                                                             read_metrics):
    text = "le café où l'on dîne, 日本の猫. " * 40
    tok = train_tokenizer("char", [text])
    ids = np.asarray(tok.encode(text), dtype=np.uint16)
    cfg = tiny_config(steps=2, eval_interval=2, dropout=0.0)
    trainer = setup(None, cfg, tmp_path / "run", dataset=Dataset(ids[:900], ids[900:], tok),
                    progress=False, log=lambda *_: None)
    scored = trainer.eval_y[trainer.eval_y != -1]
    n_bytes = sum(len(tok.id_to_token(int(i)).encode("utf-8")) for i in scored)
    assert trainer.eval_bytes == n_bytes > len(scored)  # é, ù, î and the kanji: 2-3 bytes
    trainer.run()
    (row,) = [r for r in read_metrics(tmp_path / "run") if "val_loss" in r]
    assert row["val_bpb"] == pytest.approx(
        row["val_loss"] * len(scored) / (math.log(2) * n_bytes), rel=1e-6)

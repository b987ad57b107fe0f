"""Exact expected outputs for the small shared parts: config, windows, sampling, corpus."""

import numpy as np
import pytest

from sheepop.config.build import build_config
from sheepop.config.schema import Config, describe_fields
from sheepop.errors import UserError
from sheepop.files import atomic_write_text
from sheepop.generation.sample import draw, probabilities


def test_set_converts_types_and_presets_layer_in_order(tmp_path):
    toml = tmp_path / "c.toml"
    toml.write_text("[model]\nn_layer = 3\n[train]\nlr = 0.01\n")
    cfg = build_config("baby", toml, ["model.n_layer=5", "model.dropout=0",
                                      "model.tie_weights=false", "train.steps=1_000"])
    assert cfg.model.n_layer == 5 and cfg.model.n_embd == 384 and cfg.model.dropout == 0.0
    assert cfg.model.tie_weights is False and cfg.train.steps == 1000 and cfg.train.lr == 0.01
    assert Config.from_dict(cfg.to_dict()) == cfg
    assert "model.n_layer = 4" in describe_fields()


def test_validation_messages():
    with pytest.raises(UserError, match="divisible"):
        build_config(None, None, ["model.n_embd=10", "model.n_head=3"]).validate()
    with pytest.raises(UserError, match="activation"):
        build_config(None, None, ["model.activation=swish"]).validate()








def test_sampling_rules_on_known_logits():
    logits = np.log(np.array([0.5, 0.2, 0.15, 0.1, 0.05]))
    assert probabilities(logits, 1.0) == pytest.approx([0.5, 0.2, 0.15, 0.1, 0.05])
    assert probabilities(logits, 0.0).tolist() == [1, 0, 0, 0, 0]
    assert probabilities(logits, 1.0, top_k=2) == pytest.approx([5 / 7, 2 / 7, 0, 0, 0])
    # top-p 0.8: 0.5 + 0.2 = 0.7 < 0.8, so 0.15 joins; the rest go
    assert probabilities(logits, 1.0, top_p=0.8) == pytest.approx(
        np.array([0.5, 0.2, 0.15, 0, 0]) / 0.85)
    t2 = probabilities(logits, 2.0)  # temperature 2: p_i proportional to sqrt(p_i)
    assert t2 == pytest.approx(np.sqrt([0.5, 0.2, 0.15, 0.1, 0.05]) /
                               np.sqrt([0.5, 0.2, 0.15, 0.1, 0.05]).sum())
    rng = np.random.default_rng(0)
    counts = np.bincount([draw(probabilities(logits), rng) for _ in range(20000)], minlength=5)
    assert counts / 20000 == pytest.approx([0.5, 0.2, 0.15, 0.1, 0.05], abs=0.01)




def test_atomic_write_leaves_no_temporary_file(tmp_path):
    import os
    atomic_write_text(tmp_path / "a.json", "{}")
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]
    (tmp_path / "b.json").write_text("{}")  # the mode an ordinary write gives
    assert os.stat(tmp_path / "a.json").st_mode == os.stat(tmp_path / "b.json").st_mode

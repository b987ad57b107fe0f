"""Exact expected outputs for the small shared parts: config, windows, sampling, corpus."""

import numpy as np
import pytest

from sheepop.checkpoint import atomic_write_text
from sheepop.config import Config, build_config, describe_fields
from sheepop.data.corpus import stdlib_files, stdlib_texts
from sheepop.data.windows import WindowSampler, chunk_starts, eval_windows, window
from sheepop.errors import UserError
from sheepop.sample import draw, probabilities


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


def test_chunks_cover_the_stream_and_pad_the_last_window():
    tokens = np.arange(11)  # 10 (input, target) pairs
    assert chunk_starts(11, 4, 4).tolist() == [0, 4, 8]
    assert chunk_starts(11, 4, 3).tolist() == [0, 3, 6]  # 6 + 4 covers pair 9
    assert chunk_starts(12, 4, 3).tolist() == [0, 3, 6, 9]  # pair 10 needs a padded window
    x, y = window(tokens, 8, 4, pad_id=99)
    assert x.tolist() == [8, 9, 99, 99] and y.tolist() == [9, 10, -1, -1]
    x, y = window(tokens, 0, 4, pad_id=99)
    assert x.tolist() == [0, 1, 2, 3] and y.tolist() == [1, 2, 3, 4]


def test_sampler_state_round_trips_through_json():
    import json
    tokens = np.arange(100)
    for mode in ("random", "chunks"):
        a = WindowSampler(tokens, 8, 3, seed=5, mode=mode, stride=5)
        a.next_batch()
        saved = json.loads(json.dumps(a.state()))
        expected = [a.next_batch() for _ in range(20)]
        b = WindowSampler(tokens, 8, 3, seed=123, mode=mode, stride=5)
        b.set_state(saved)
        for (x1, y1), (x2, y2) in zip(expected, [b.next_batch() for _ in range(20)]):
            assert (x1 == x2).all() and (y1 == y2).all()
            assert (y1[y1 >= 0] == x1[y1 >= 0] + 1).all()  # targets are the next tokens


def test_eval_windows_are_fixed_and_spread():
    x, y = eval_windows(np.arange(1000), 10, 5, pad_id=0)
    assert x[:, 0].tolist() == [0, 250, 500, 740, 990] and (y[-1][-1] == -1)


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


def test_default_corpus_is_the_stdlib_in_a_fixed_order():
    files = stdlib_files()
    assert files == sorted(files, key=lambda p: p.parts) or files == stdlib_files()
    assert any(f.name == "os.py" for f in files)
    assert not any("site-packages" in f.parts for f in files)
    texts, report = stdlib_texts(200_000)
    assert report.files_read == len(texts) and report.truncated
    assert 190_000 <= report.bytes_read <= 200_000
    assert "read" in report.summary() and "MB" in report.summary()


def test_atomic_write_leaves_no_temporary_file(tmp_path):
    import os
    atomic_write_text(tmp_path / "a.json", "{}")
    assert [p.name for p in tmp_path.iterdir()] == ["a.json"]
    (tmp_path / "b.json").write_text("{}")  # the mode an ordinary write gives
    assert os.stat(tmp_path / "a.json").st_mode == os.stat(tmp_path / "b.json").st_mode

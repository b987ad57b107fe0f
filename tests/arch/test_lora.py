"""sheepop.arch.lora, what both engines share about LoRA: the config and its file, which layers
the targets name, the adapters' shapes and initialisation, and merging W + (alpha / r) B A."""

import json

import numpy as np
import pytest
from variants import gqa, llama

from sheepop.arch.lora import (
    LORA_FILE,
    NEW_ROWS,
    LoraConfig,
    adapter_param_count,
    adapter_shapes,
    check_adapters,
    init_adapters,
    is_adapter,
    lora_targets,
    merge,
    parse_targets,
)
from sheepop.config.finetune import LORA_TARGETS, LoraSettings
from sheepop.config.schema import ModelConfig
from sheepop.errors import UserError

GPT_SHAPED = ModelConfig(vocab_size=11, n_layer=2, n_head=2, n_embd=8, d_ff=12)
LLAMA_SHAPED = ModelConfig(vocab_size=11, n_layer=2, n_embd=8, d_ff=12, **llama(**gqa(4, 2)))


def test_config_round_trips_through_its_dict_and_file(tmp_path):
    lora = LoraConfig(4, 8, ["down", "qkv"], "/runs/base", 3)
    assert lora.targets == ("qkv", "down")  # the canonical order, whatever the order given
    assert lora.alpha == 8.0 and isinstance(lora.alpha, float) and lora.scale == 2.0
    assert LoraConfig.from_dict(lora.to_dict()) == lora
    assert json.loads(json.dumps(lora.to_dict())) == {
        "rank": 4, "alpha": 8.0, "targets": ["qkv", "down"], "base_run": "/runs/base",
        "new_tokens": 3}
    lora.save(tmp_path)
    assert (tmp_path / LORA_FILE).exists()
    assert LoraConfig.load(tmp_path) == lora
    assert LoraConfig.load(tmp_path / "nowhere") is None
    # a dict without base_run takes the one given beside it; without new_tokens, none train
    old = LoraConfig.from_dict({"rank": 2, "alpha": 4, "targets": ["proj"]}, "/b")
    assert (old.base_run, old.new_tokens) == ("/b", 0)


def test_the_lora_section_holds_the_only_defaults_and_for_run_resolves_them():
    with pytest.raises(TypeError):
        LoraConfig()  # no defaults of its own: rank, alpha and targets come from [lora]
    # the section's defaults: alpha 0 (= 2r), targets qkv,proj, the new tokens' rows trained
    lora = LoraConfig.for_run(LoraSettings(rank=4), GPT_SHAPED, "/b", 3)
    assert (lora.rank, lora.alpha, lora.targets, lora.scale, lora.base_run, lora.new_tokens) \
        == (4, 8.0, ("qkv", "proj"), 2.0, "/b", 3)
    frozen = LoraSettings(rank=2, alpha=3.0, targets="fc,qkv", train_new_tokens=False)
    assert LoraConfig.for_run(frozen, GPT_SHAPED, "/b", 3) == LoraConfig(2, 3.0, ("qkv", "fc"),
                                                                         "/b", 0)
    assert LoraConfig.for_run(LoraSettings(), GPT_SHAPED, "/b", 3) is None  # rank 0: full
    with pytest.raises(UserError, match="LoRA rank 9 is above 8"):
        LoraConfig.for_run(LoraSettings(rank=9), GPT_SHAPED, "/b", 0)
    assert parse_targets(" proj,qkv ,proj") == ("qkv", "proj")
    assert LoraConfig(2, 1.0, "fc").targets == ("fc",)


@pytest.mark.parametrize("kwargs,message", [
    ({"rank": 0}, "rank must be an integer >= 1"),
    ({"rank": 2.5}, "rank must be an integer >= 1"),
    ({"rank": True}, "rank must be an integer >= 1"),
    ({"new_tokens": -1}, "new_tokens must be an integer >= 0"),
    ({"new_tokens": 1.5}, "new_tokens must be an integer >= 0"),
    ({"alpha": 0}, "alpha must be a number > 0"),
    ({"alpha": -1.0}, "alpha must be a number > 0"),
    ({"alpha": float("nan")}, "alpha must be a number > 0"),
    ({"alpha": "16"}, "alpha must be a number > 0"),
    ({"targets": ("qkv", "attn")}, "unknown LoRA target 'attn' \\(known: qkv, proj, fc, down\\)"),
    ({"targets": ()}, "at least one target"),
])
def test_bad_values_are_refused_with_one_clear_message(kwargs, message):
    with pytest.raises(UserError, match=message):
        LoraConfig(**{"rank": 2, "alpha": 4.0, "targets": ("qkv",), **kwargs})


def test_a_bad_file_names_itself(tmp_path):
    (tmp_path / LORA_FILE).write_text('{"rank": 4, "alpha": 8, "dropout": 0.1}')
    with pytest.raises(UserError, match=f"{LORA_FILE}: unknown LoRA setting 'dropout'"):
        LoraConfig.load(tmp_path)
    (tmp_path / LORA_FILE).write_text('{"rank": -1, "alpha": 8, "targets": ["qkv"]}')
    with pytest.raises(UserError, match=f"{LORA_FILE}: LoRA rank must be"):
        LoraConfig.load(tmp_path)
    (tmp_path / LORA_FILE).write_text('{"rank": 4, "targets": ["qkv"]}')  # no default to fill
    with pytest.raises(UserError, match=f"{LORA_FILE}: the LoRA setting 'alpha' is missing"):
        LoraConfig.load(tmp_path)
    (tmp_path / LORA_FILE).write_text('[4, 8]')
    with pytest.raises(UserError, match="not a JSON object"):
        LoraConfig.load(tmp_path)


def test_targets_name_the_layers_of_each_ffn_kind():
    assert lora_targets(GPT_SHAPED, ["qkv", "fc"]) == [
        "blocks.0.attn.qkv", "blocks.0.ffn.fc", "blocks.1.attn.qkv", "blocks.1.ffn.fc"]
    assert lora_targets(LLAMA_SHAPED, "fc,down,proj") == [
        "blocks.0.attn.proj", "blocks.0.ffn.gate", "blocks.0.ffn.up", "blocks.0.ffn.proj",
        "blocks.1.attn.proj", "blocks.1.ffn.gate", "blocks.1.ffn.up", "blocks.1.ffn.proj"]
    with pytest.raises(UserError, match="unknown LoRA target 'mlp'"):
        lora_targets(GPT_SHAPED, ["mlp"])


def test_adapter_shapes_follow_each_layer():
    # LLAMA_SHAPED: d = 8, 4 query heads and 2 kv heads of width 2 -> qkv out (4 + 4) * 2 = 16
    shapes = adapter_shapes(LLAMA_SHAPED, LoraConfig(3, 1.0, LORA_TARGETS))
    assert {k: v for k, v in shapes.items() if k.startswith("blocks.1.")} == {
        "blocks.1.attn.qkv.lora_A": (3, 8), "blocks.1.attn.qkv.lora_B": (16, 3),
        "blocks.1.attn.proj.lora_A": (3, 8), "blocks.1.attn.proj.lora_B": (8, 3),
        "blocks.1.ffn.gate.lora_A": (3, 8), "blocks.1.ffn.gate.lora_B": (12, 3),
        "blocks.1.ffn.up.lora_A": (3, 8), "blocks.1.ffn.up.lora_B": (12, 3),
        "blocks.1.ffn.proj.lora_A": (3, 12), "blocks.1.ffn.proj.lora_B": (8, 3)}
    assert len(shapes) == 20
    # r (in + out) per layer: 3 * (24 + 16 + 20 + 20 + 20) = 300 per block
    assert adapter_param_count(LLAMA_SHAPED, LoraConfig(3, 1.0, LORA_TARGETS)) == 600


def test_init_starts_B_at_zero_and_draws_A_in_its_bound():
    lora = LoraConfig(4, 8.0, ("qkv", "down"))
    a = init_adapters(GPT_SHAPED, lora, seed=3)
    check_adapters(GPT_SHAPED, lora, a)
    assert set(a) == set(adapter_shapes(GPT_SHAPED, lora))
    for name, value in a.items():
        assert value.dtype == np.float32
        if name.endswith("lora_B"):
            assert not value.any()
        else:
            bound = 1 / np.sqrt(value.shape[1])  # U(-1/sqrt(in), 1/sqrt(in))
            assert np.abs(value).max() <= bound and np.abs(value).max() > 0.5 * bound
    again = init_adapters(GPT_SHAPED, lora, seed=3)
    assert all(np.array_equal(a[k], again[k]) for k in a)
    other = init_adapters(GPT_SHAPED, lora, seed=4)
    assert not np.array_equal(a["blocks.0.attn.qkv.lora_A"], other["blocks.0.attn.qkv.lora_A"])
    many = init_adapters(ModelConfig(vocab_size=5, n_layer=1, n_head=1, n_embd=300, d_ff=4),
                         LoraConfig(64, 1.0, ("qkv",)), seed=0)["blocks.0.attn.qkv.lora_A"]
    assert many.var() == pytest.approx(1 / (3 * 300), rel=0.02)  # the uniform's variance


def test_check_adapters_names_the_first_difference():
    lora = LoraConfig(2, 1.0, ("proj",))
    good = init_adapters(GPT_SHAPED, lora)
    with pytest.raises(UserError, match="missing \\['blocks.1.attn.proj.lora_B'\\]"):
        check_adapters(GPT_SHAPED, lora, {k: v for k, v in good.items()
                                          if k != "blocks.1.attn.proj.lora_B"})
    bad = {**good, "blocks.0.attn.proj.lora_A": np.zeros((3, 8))}
    with pytest.raises(UserError, match="lora_A has shape \\(3, 8\\), the config expects"):
        check_adapters(GPT_SHAPED, lora, bad)


def test_merge_adds_the_scaled_product_and_leaves_the_rest():
    rng = np.random.default_rng(0)
    w = {"blocks.0.attn.qkv.weight": rng.standard_normal((6, 4)).astype(np.float32),
         "blocks.0.attn.qkv.bias": rng.standard_normal(6).astype(np.float32),
         "tok_emb.weight": rng.standard_normal((5, 4)).astype(np.float32)}
    before = {k: v.copy() for k, v in w.items()}
    a, b = rng.standard_normal((2, 4)), rng.standard_normal((6, 2))
    lora = LoraConfig(2, 3.0, ("qkv",))
    merged = merge(w, {"blocks.0.attn.qkv.lora_A": a, "blocks.0.attn.qkv.lora_B": b}, lora)
    expected = (w["blocks.0.attn.qkv.weight"] + 1.5 * b @ a).astype(np.float32)
    np.testing.assert_allclose(merged["blocks.0.attn.qkv.weight"], expected, rtol=1e-6)
    assert merged["blocks.0.attn.qkv.weight"].dtype == np.float32
    assert merged["tok_emb.weight"] is w["tok_emb.weight"]
    assert all(np.array_equal(w[k], before[k]) for k in w)  # the input is not modified
    # a hand example: W = 0, B A = [[1, 2], [3, 6]] * s
    tiny = merge({"blocks.0.attn.proj.weight": np.zeros((2, 2))},
                 {"blocks.0.attn.proj.lora_A": np.array([[1.0, 2.0]]),
                  "blocks.0.attn.proj.lora_B": np.array([[1.0], [3.0]])},
                 LoraConfig(1, 0.5, LORA_TARGETS))
    assert tiny["blocks.0.attn.proj.weight"].tolist() == [[0.5, 1.0], [1.5, 3.0]]


@pytest.mark.parametrize("adapters,message", [
    ({"blocks.0.attn.proj.lora_A": np.zeros((1, 2))}, "lacks blocks.0.attn.proj.lora_B"),
    ({"blocks.0.attn.qkv.lora_A": np.zeros((1, 2)), "blocks.0.attn.qkv.lora_B": np.zeros((2, 1))},
     "adapts blocks.0.attn.qkv.weight, which the weights lack"),
    ({"blocks.0.attn.proj.lora_A": np.zeros((1, 3)), "blocks.0.attn.proj.lora_B": np.zeros((2, 1))},
     "do not fit blocks.0.attn.proj.weight \\(2, 2\\) at rank 1"),
    ({"blocks.0.attn.proj.weight": np.zeros((2, 2))}, "is not a lora_A, lora_B or new rows"),
    ({"tok_emb.new_rows": np.zeros((1, 2))}, "tok_emb.new_rows \\(1, 2\\) does not fit "
                                             "tok_emb.weight None"),
])
def test_merge_refuses_adapters_that_do_not_fit(adapters, message):
    with pytest.raises(UserError, match=message):
        merge({"blocks.0.attn.proj.weight": np.zeros((2, 2))}, adapters,
              LoraConfig(1, 1.0, LORA_TARGETS))


def test_new_token_rows_follow_the_per_token_tables():
    """The last n rows of the embedding, of an untied head and of a head bias train under LoRA;
    a tied head has no rows of its own (it reads the embedding's)."""
    lora = LoraConfig(3, 1.0, ("proj",), new_tokens=2)
    tied = adapter_shapes(GPT_SHAPED, lora)
    assert tied["tok_emb.new_rows"] == (2, 8) and "head.new_rows" not in tied
    untied = ModelConfig(**{**LLAMA_SHAPED.__dict__, "head_bias": True})
    shapes = adapter_shapes(untied, lora)
    assert (shapes["tok_emb.new_rows"], shapes["head.new_rows"], shapes["head.new_bias"]) == (
        (2, 8), (2, 8), (2,))
    # 3 (8 + 8) per attention projection, 2 blocks, plus 2 (8 + 8 + 1) new-row entries
    assert adapter_param_count(untied, lora) == 2 * 48 + 34
    assert all(is_adapter(n) for n in shapes) and not is_adapter("tok_emb.weight")
    with pytest.raises(UserError, match="new_tokens 12 exceeds the vocabulary \\(11 ids\\)"):
        adapter_shapes(GPT_SHAPED, LoraConfig(8, 16.0, LORA_TARGETS, new_tokens=12))


def test_new_rows_start_as_the_base_rows_and_merge_into_their_place():
    cfg = ModelConfig(**{**LLAMA_SHAPED.__dict__, "head_bias": True})
    lora = LoraConfig(2, 1.0, ("qkv",), new_tokens=3)
    rng = np.random.default_rng(5)
    weights = {"tok_emb.weight": rng.standard_normal((11, 8)).astype(np.float32),
               "head.weight": rng.standard_normal((11, 8)).astype(np.float32),
               "head.bias": rng.standard_normal(11).astype(np.float32)}
    fresh = init_adapters(cfg, lora, seed=0, weights=weights)
    for rows, table in NEW_ROWS.items():
        np.testing.assert_array_equal(fresh[rows], weights[table][-3:])
    with pytest.raises(ValueError, match="pass them"):
        init_adapters(cfg, lora)
    trained = {k: v + 1 if k in NEW_ROWS else v for k, v in fresh.items()}
    merged = merge({**weights, "blocks.0.attn.qkv.weight": np.zeros((16, 8)),
                    "blocks.1.attn.qkv.weight": np.zeros((16, 8))}, trained, lora)
    for table in NEW_ROWS.values():
        np.testing.assert_array_equal(merged[table][:-3], weights[table][:-3])
        np.testing.assert_array_equal(merged[table][-3:], weights[table][-3:] + 1)

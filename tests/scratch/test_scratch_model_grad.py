"""FFN, block and whole-model backward passes against finite differences (float64)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scratch_gradcheck import check
from variants import RMSNORM, ROPE, SWIGLU, gqa, llama

from sheepop.config.schema import ModelConfig
from sheepop.scratch.block import block_backward, block_forward
from sheepop.scratch.ffn import ffn_backward, ffn_forward, swiglu_backward, swiglu_forward
from sheepop.scratch.gpt import GPT, gpt_backward, gpt_forward
from sheepop.scratch.init import init_params, param_shapes
from sheepop.scratch.special import normal_cdf


def small_config(**kw) -> ModelConfig:
    base = dict(vocab_size=7, block_size=6, n_layer=2, n_head=2, n_embd=8, d_ff=12)
    base.update(kw)
    return ModelConfig(**base)


def bigger_weights(params: dict, rng: np.random.Generator) -> dict:
    """Weights far from init (N(0, 0.02) makes every gradient tiny and the check weak)."""
    for v in params.values():
        v += rng.standard_normal(v.shape) * (0.3 if v.ndim > 1 else 0.2)
    return params


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "relu", "relu2"])
def test_ffn(activation):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 4))
    w_fc, b_fc = rng.standard_normal((6, 4)), rng.standard_normal(6)
    w_proj, b_proj = rng.standard_normal((4, 6)), rng.standard_normal(4)
    args = lambda: (x, w_fc, b_fc, w_proj, b_proj, activation)  # noqa: E731
    out, cache = ffn_forward(*args())
    dout = rng.standard_normal(out.shape)
    dx, grads = ffn_backward(dout, cache)
    check(lambda: ffn_forward(*args())[0],
          {"x": x, "fc.weight": w_fc, "fc.bias": b_fc, "proj.weight": w_proj,
           "proj.bias": b_proj},
          {"x": dx, **grads}, dout)


@pytest.mark.parametrize("bias", [True, False])
def test_swiglu(bias):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 4))
    w = {"gate.weight": rng.standard_normal((6, 4)), "up.weight": rng.standard_normal((6, 4)),
         "proj.weight": rng.standard_normal((4, 6))}
    if bias:
        w.update({"gate.bias": rng.standard_normal(6), "up.bias": rng.standard_normal(6),
                  "proj.bias": rng.standard_normal(4)})

    def forward():
        return swiglu_forward(x, w["gate.weight"], w.get("gate.bias"), w["up.weight"],
                              w.get("up.bias"), w["proj.weight"], w.get("proj.bias"))[0]

    out = forward()
    g = x @ w["gate.weight"].T + w.get("gate.bias", 0)
    u = x @ w["up.weight"].T + w.get("up.bias", 0)
    expected = (g / (1 + np.exp(-g)) * u) @ w["proj.weight"].T + w.get("proj.bias", 0)
    np.testing.assert_allclose(out, expected, rtol=1e-13, atol=1e-13)  # W2 (silu(W1 x) * W3 x)
    _, cache = swiglu_forward(x, w["gate.weight"], w.get("gate.bias"), w["up.weight"],
                              w.get("up.bias"), w["proj.weight"], w.get("proj.bias"))
    dout = rng.standard_normal(out.shape)
    dx, grads = swiglu_backward(dout, cache)
    assert (grads["gate.bias"] is None) == (not bias)
    check(forward, {"x": x, **w}, {"x": dx, **grads}, dout)


@pytest.mark.parametrize("kw", [{}, {"n_head": 1, "bias": False}, {"dropout": 0.2},
                                {**SWIGLU, **gqa(4, 2)},
                                {**SWIGLU, **RMSNORM, "bias": False}])
def test_block(kw):
    cfg = small_config(**kw)
    rng = np.random.default_rng(1)
    params = bigger_weights(init_params(cfg, 0, np.float64), rng)
    x = rng.standard_normal((2, 5, cfg.n_embd))

    def forward():
        gen = np.random.default_rng(5) if cfg.dropout else None
        return block_forward(x, params, "blocks.1.", cfg, gen)[0]

    gen = np.random.default_rng(5) if cfg.dropout else None
    out, cache = block_forward(x, params, "blocks.1.", cfg, gen)
    dout = rng.standard_normal(out.shape)
    dx, grads = block_backward(dout, cache, "blocks.1.")
    block_params = {k: v for k, v in params.items() if k.startswith("blocks.1.")}
    assert set(k for k, g in grads.items() if g is not None) == set(block_params)
    check(forward, {"x": x, **block_params}, {"x": dx, **grads}, dout)


MODEL_VARIANTS = [
    {},                                                            # tied, sinusoidal, gelu
    {"tie_weights": False, "head_bias": True, "pos_encoding": "learned"},
    {"n_head": 1, "bias": False, "activation": "gelu_tanh"},       # the single-head model
    {"n_head": 4, "activation": "relu", "n_layer": 1},
    {**RMSNORM, "bias": False, "pos_encoding": "learned"},
    {**ROPE, **gqa(4, 2)},                                         # rope + GQA
    {**ROPE, **gqa(2, 1), "bias": False},                          # rope + MQA
    {**RMSNORM, **SWIGLU},                                         # with biases
    llama(**gqa(4, 2)),                                            # Llama-shaped
    {"logit_softcap": 2.0, "activation": "relu2"},                 # the modern recipe's
    {**ROPE, **gqa(4, 2), "qk_norm": True},                        # QK-norm, then RoPE
    {"qk_norm": True, "n_head": 2},                                # QK-norm alone
    {"value_embeds": 1},                                           # one table, two layers
    {**ROPE, **gqa(4, 2), "value_embeds": 2, "n_layer": 5},        # grouped values, 2 tables
    {"unet_skips": True, "n_layer": 5},                            # two skips, a middle block
    {**RMSNORM, "unet_skips": True, "value_embeds": 2, "n_layer": 4, "bias": False},
]


@pytest.mark.parametrize("kw", MODEL_VARIANTS)
def test_whole_model_with_padded_targets(kw):
    cfg = small_config(**kw)
    rng = np.random.default_rng(2)
    params = bigger_weights(init_params(cfg, 3, np.float64), rng)
    idx = rng.integers(0, cfg.vocab_size, (3, 6))
    targets = rng.integers(0, cfg.vocab_size, (3, 6))
    targets[0, 4:] = -1  # a padded tail
    targets[2, 0] = -1
    _, loss, cache = gpt_forward(params, cfg, idx, targets)
    grads = gpt_backward(cache)
    assert set(grads) == set(param_shapes(cfg))
    check(lambda: gpt_forward(params, cfg, idx, targets)[1], params, grads, None,
          max_entries=12)


def test_model_dropout_gradient_uses_the_forward_masks():
    cfg = small_config(dropout=0.3)
    rng = np.random.default_rng(4)
    params = bigger_weights(init_params(cfg, 3, np.float64), rng)
    idx = rng.integers(0, cfg.vocab_size, (2, 6))
    targets = rng.integers(0, cfg.vocab_size, (2, 6))

    def loss():
        return gpt_forward(params, cfg, idx, targets, np.random.default_rng(9))[1]

    _, _, cache = gpt_forward(params, cfg, idx, targets, np.random.default_rng(9))
    grads = gpt_backward(cache)
    check(loss, params, grads, None, max_entries=8)
    assert loss() != gpt_forward(params, cfg, idx, targets)[1]  # dropout did act


def test_accumulation_and_dloss_scaling():
    cfg = small_config()
    model = GPT(cfg, dtype=np.float64, seed=1)
    rng = np.random.default_rng(6)
    a = [rng.integers(0, 7, (2, 6)) for _ in range(2)]
    b = [rng.integers(0, 7, (2, 6)) for _ in range(2)]
    model.forward(a[0], a[1])
    model.backward(0.5)
    model.forward(b[0], b[1])
    model.backward(0.5)
    accumulated = {k: v.copy() for k, v in model.grads.items()}
    both_x, both_y = np.concatenate([a[0], b[0]]), np.concatenate([a[1], b[1]])
    model.zero_grad()
    model.forward(both_x, both_y)
    model.backward()
    for k, v in model.grads.items():  # equal-size micro-batches: the mean of means is the mean
        np.testing.assert_allclose(accumulated[k], v, rtol=1e-10, atol=1e-15)


def test_normal_cdf_accuracy():
    x = np.linspace(-12, 12, 2001)
    ref = np.array([0.5 * math.erfc(-v / math.sqrt(2)) for v in x])
    assert np.max(np.abs(normal_cdf(x) - ref) / ref) < 1e-13
    x32 = x.astype(np.float32)
    got = normal_cdf(x32)
    assert got.dtype == np.float32
    ref32 = np.array([0.5 * math.erfc(-float(v) / math.sqrt(2)) for v in x32])
    assert np.max(np.abs(got - ref32)) < 3e-7
    near = np.abs(x32) < 5
    assert np.max(np.abs(got - ref32)[near] / ref32[near]) < 3e-6  # float32: x^2 rounds

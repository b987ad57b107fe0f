"""The compiled decode step (sheepop.scratch.decode_step, its kernels in
sheepop.scratch.decode_kernels): each kernel equals the NumPy unit it stands for within
float32's rounding of its sums, a whole model's decode steps give gpt_forward's logits (a ring
cache past the context included), and every model or call the step does not compute goes to
gpt_forward."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from sheepop.config.schema import ModelConfig
from sheepop.generation.running_batch import RunningBatch
from sheepop.scratch.attention import grouped_decode_forward
from sheepop.scratch.decode_kernels import (
    add_rms_norm_row,
    attend_row,
    rms_norm_row,
    silu_mul_row,
)
from sheepop.scratch.decode_step import refusal
from sheepop.scratch.hooks import hooked
from sheepop.scratch.init import init_params
from sheepop.scratch.layers import silu_forward
from sheepop.scratch.lm import NumpyLM
from sheepop.scratch.narrow import narrow_weights
from sheepop.scratch.norm import rmsnorm_forward
from sheepop.scratch.rope import rope_angles, rope_forward

EPS32 = float(np.finfo(np.float32).eps)


def _cfg(**changes) -> ModelConfig:
    settings = dict(vocab_size=50, block_size=32, n_layer=2, n_head=4, n_kv_head=2, n_embd=32,
                    d_ff=64, pos_encoding="rope", norm="rmsnorm", ffn="swiglu", bias=False,
                    tie_weights=True, dropout=0.0)
    return ModelConfig(**{**settings, **changes})


def test_the_norms_are_rmsnorm_forward():
    rng = np.random.default_rng(0)
    x, a = (rng.normal(size=576).astype(np.float32) * 3 for _ in range(2))
    gamma = rng.normal(size=576).astype(np.float32)
    want = rmsnorm_forward(x[None], gamma, 1e-5)[0][0]
    got = np.empty(576, np.float32)
    rms_norm_row(x, gamma, 1e-5, got)
    # mean(x^2)'s sum of 576 squares in another order: relative error <= 577 eps, halved by
    # the square root; then three products rounded once each
    np.testing.assert_allclose(got, want, rtol=(577 / 2 + 4) * EPS32, atol=0)
    added = x.copy()
    add_rms_norm_row(added, a, gamma, 1e-5, got)
    np.testing.assert_array_equal(added, x + a)  # the stream takes the branch, in place
    np.testing.assert_allclose(got, rmsnorm_forward((x + a)[None], gamma, 1e-5)[0][0],
                               rtol=(577 / 2 + 4) * EPS32, atol=0)


def test_silu_times_u_is_silu_forward_times_u():
    g = np.float32([-200, -88.5, -5, -1e-3, 0, 1e-3, 2, 40, 100])
    u = np.linspace(-2, 3, len(g)).astype(np.float32)
    got = np.empty_like(g)
    silu_mul_row(g, u, got)
    want = silu_forward(g)[0] * u
    np.testing.assert_allclose(got, want, rtol=4 * EPS32, atol=0)  # exp's last bit, 3 roundings
    assert got[0] == 0 and np.all(np.isfinite(got))


@pytest.mark.parametrize(("n_head", "n_kv"), [(4, 2), (3, 3), (9, 3), (2, 1)])
@pytest.mark.parametrize("keys", [1, 7, 70])
def test_attention_is_rope_then_the_grouped_decode_attention(n_head, n_kv, keys):
    """The new key and value land in the cache's column after being turned (the key), and
    each head's output is softmax(q K^T / sqrt(d_k)) V over the first `keys` columns of its
    key/value head: rope_forward then grouped_decode_forward, the NumPy engine's decode."""
    rng = np.random.default_rng(n_head * keys)
    dk, capacity, column, position = 16, 80, keys - 1, 123
    qkv = rng.normal(size=(n_head + 2 * n_kv) * dk).astype(np.float32) * 2
    k_cache, v_cache = (rng.normal(size=(n_kv, capacity, dk)).astype(np.float32)
                        for _ in range(2))
    angles = rope_angles(slice(position, position + 1), dk, 10000.0, np.float32)
    heads = qkv.reshape(1, n_head + 2 * n_kv, 1, dk)
    turned = rope_forward(np.ascontiguousarray(heads[:, :n_head + n_kv]), angles)
    k_want, v_want = k_cache.copy(), v_cache.copy()
    k_want[:, column], v_want[:, column] = turned[0, n_head:, 0], heads[0, n_head + n_kv:, 0]
    want, _ = grouped_decode_forward(turned[:, :n_head], k_want[None, :, :keys],
                                     v_want[None, :, :keys])
    y = np.empty(n_head * dk, np.float32)
    turn = angles.turn[0]
    attend_row(qkv, k_cache, v_cache, column, keys, np.ascontiguousarray(turn.real),
               np.ascontiguousarray(turn.imag), n_head, y)
    np.testing.assert_allclose(k_cache, k_want, rtol=2 * EPS32, atol=4 * EPS32)
    np.testing.assert_array_equal(v_cache, v_want)
    # scores of 16 products, a softmax over `keys`, a weighted sum of `keys` values: a few
    # dozen roundings, each relative to the sizes summed (|p| |v| <= max |v|)
    np.testing.assert_allclose(y, want.reshape(-1), rtol=0,
                               atol=(4 * dk + 4 * keys) * EPS32 * np.abs(v_want).max())


def _decodes(lm: NumpyLM, ids: list[int], new: int) -> np.ndarray:
    """The prompt's last logits, then each of `new` greedy decode steps' (B = 1)."""
    out = [lm.prefill(ids)]
    for _ in range(new):
        out.append(lm.decode(int(np.argmax(out[-1]))))
    return np.stack(out)


@pytest.mark.parametrize("dtype", ["bfloat16", "int8", "int4"])
@pytest.mark.parametrize("tied", [True, False])
def test_a_models_decode_steps_are_gpt_forwards_past_the_context_too(dtype, tied):
    """The compiled steps against gpt_forward's, the same model and tokens: 10 + 30 tokens in a
    context of 32 (the ring cache overwrites its oldest columns for the last 8). bf16
    multiplies x itself: the two agree to float32's sums. int8 and int4 round x to 8 bits a
    block, and a float32 difference that crosses a rounding boundary moves that input by a
    step (1/127 of its block's largest), which later positions carry: most steps agree to
    float32's precision, none by more than such a step (as test_narrow's decode steps and
    prompts)."""
    cfg = _cfg(tie_weights=tied)
    lm = NumpyLM(cfg, narrow_weights(init_params(cfg, seed=4), dtype))
    assert lm.step is not None
    ids = np.random.default_rng(7).integers(0, cfg.vocab_size, 10).tolist()
    tokens = [ids]  # the compiled run's greedy tokens, fed to both runs
    compiled = [lm.prefill(ids)]
    for _ in range(30):
        tokens.append([int(np.argmax(compiled[-1]))])
        compiled.append(lm.decode(tokens[-1][0]))
    assert lm.cache.full and lm.cache.length == 40
    step, lm.step = lm.step, None
    plain = [lm.prefill(ids)] + [lm.decode(t[0]) for t in tokens[1:]]
    apart = np.abs(np.stack(compiled) - np.stack(plain)).max(axis=1) / np.abs(plain).max()
    if dtype == "bfloat16":
        assert apart.max() <= 1e-5, apart
    else:
        assert apart.max() <= 2.0 ** -7 and np.mean(apart <= 1e-4) >= 0.5, apart
    lm.step = step


def test_a_model_the_step_does_not_compute_is_named_and_runs_gpt_forward():
    weights = lambda cfg: narrow_weights(init_params(cfg, seed=0), "int8")  # noqa: E731
    for changes, named in [({"norm": "layernorm"}, "model.norm = layernorm"),
                           ({"ffn": "mlp"}, "model.ffn = mlp"),
                           ({"qk_norm": True}, "model.qk_norm = True"),
                           ({"bias": True}, "blocks.0.attn.proj.bias: a parameter"),
                           ({"head_bias": True}, "head.bias: a parameter"),
                           ({"value_embeds": 1}, "a parameter the compiled step does not read"),
                           ({"unet_skips": True}, "a parameter the compiled step does not read")]:
        cfg = _cfg(**changes)
        params = weights(cfg)
        assert named in refusal(cfg, params)
        assert NumpyLM(cfg, params).step is None
    cfg = _cfg()
    assert "is float32" in refusal(cfg, init_params(cfg, seed=0))
    assert NumpyLM(cfg, init_params(cfg, seed=0)).step is None  # float32: no numba at all


def test_hooks_and_steering_take_gpt_forward(monkeypatch):
    """A decode step that a hook reads, or that steering adds to, runs gpt_forward, which has
    the hook points; so does a batch."""
    cfg = _cfg()
    lm = NumpyLM(cfg, narrow_weights(init_params(cfg, seed=1), "int8"))
    lm.prefill([1, 2, 3])

    def refuse(*_):
        raise AssertionError("the compiled step ran")
    monkeypatch.setattr(lm, "step", refuse)
    seen = []
    with hooked(cfg, {"blocks.1.resid_out": lambda h, p: seen.append(p) or h}):
        lm.decode(4)
    assert seen == ["blocks.1.resid_out"]
    lm.additions = {0: np.ones(cfg.n_embd, np.float32)}
    lm.decode(5)
    lm.additions = {}
    lm.prefill_batch([[1, 2], [3, 4]])
    lm.decode_batch([5, 6])


def test_a_servers_running_batch_of_one_row_takes_the_step():
    """The server's continuous batch holding one row without padding decodes through the step
    (its cache a one-row view of the batch's store), with gpt_forward's logits (bf16: to
    float32's sums)."""
    cfg = _cfg()
    lm = NumpyLM(cfg, narrow_weights(init_params(cfg, seed=5), "bfloat16"))
    calls, step = [], lm.step
    lm.step = lambda token, cache: calls.append(token) or step(token, cache)
    batch = RunningBatch(lm, 1)
    prompt = [1, 2, 3, 4]
    got = [batch.join([prompt])[0]]
    for _ in range(6):
        got.append(batch.step([int(np.argmax(got[-1]))])[0])
    assert len(calls) == 6
    lm.step = None
    want = [lm.prefill(prompt)] + [lm.decode(int(np.argmax(z))) for z in got[:-1]]
    assert np.abs(np.stack(got) - np.stack(want)).max() <= 1e-5 * np.abs(want).max()


def test_the_first_build_says_it_compiled_the_steps_kernels(tmp_path):
    code = ("from sheepop.scratch.decode_step import warm_step_kernels;"
            "print(warm_step_kernels()); print(warm_step_kernels())")
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    said = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True, env=env).stdout.strip().splitlines() for _ in range(2)]
    assert said[0][0].startswith("sheepop: kernels: rms_norm_row, add_rms_norm_row, "
                                 "attend_row, silu_mul_row compiled in "), said
    assert said[0][1] == "None" and said[1] == ["None", "None"]

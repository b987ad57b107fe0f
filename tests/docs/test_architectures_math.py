"""The claims of docs/architectures.md that are not worked examples, checked numerically with
sheepop's own functions: RoPE's relative property on random vectors (and its closed form), the
whole rotary network's invariance to a uniform shift of positions, its backward as the transposed
finite-difference Jacobian and as the opposite rotation, Hugging Face's rotate-half layout, the
receptive field of sliding-window attention, RMSNorm's and SiLU's gradient identities, and the
group sum of grouped-query attention as the adjoint of the copy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from sheepop.config.schema import ModelConfig
from sheepop.positional import rope_frequencies
from sheepop.scratch import attention as att
from sheepop.scratch import layers as L
from sheepop.scratch import rope
from sheepop.scratch.gpt import gpt_forward
from sheepop.scratch.init import param_shapes
from sheepop.scratch.norm import rmsnorm_backward, rmsnorm_forward

EPS64 = 2.0 ** -53


def turn(x: np.ndarray, pos, theta: float = 10000.0) -> np.ndarray:
    """x (..., T, d_k) rotated at positions `pos` (a slice or an index array), float64."""
    return rope.rope_forward(x, rope.rope_angles(pos, x.shape[-1], theta, np.float64))


def at(x: np.ndarray, p: int, theta: float) -> np.ndarray:
    return turn(x[None, None, None, :], slice(p, p + 1), theta)[0, 0, 0]


def rope_weights(cfg: ModelConfig, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: (1.0 + 0.1 * rng.standard_normal(shape) if len(shape) == 1
                   else 0.5 * rng.standard_normal(shape))
            for name, shape in param_shapes(cfg).items()}


ROPE_MODEL = dict(vocab_size=11, n_embd=16, n_head=4, n_kv_head=2, n_layer=2, d_ff=32,
                  pos_encoding="rope", norm="rmsnorm", ffn="swiglu", bias=False,
                  tie_weights=False)


@pytest.mark.parametrize("dk,theta", [(8, 100.0), (64, 10000.0), (128, 500000.0)])
def test_rope_scores_depend_only_on_the_offset(dk, theta):
    """(R_m q) . (R_n k) = q^T R_{n-m} k = the pair-by-pair closed form, for any shift s; the
    rounding of p omega_i bounds the disagreement by a multiple of |q| |k| p 2^-53."""
    rng = np.random.default_rng(dk)
    omega = rope_frequencies(dk, theta)
    for _ in range(20):
        q, k = rng.standard_normal(dk), rng.standard_normal(dk)
        m, n, s = (int(v) for v in rng.integers(0, 5000, 3))
        dot = at(q, m, theta) @ at(k, n, theta)
        alpha = (n - m) * omega
        closed = np.sum((q[0::2] * k[0::2] + q[1::2] * k[1::2]) * np.cos(alpha)
                        + (q[1::2] * k[0::2] - q[0::2] * k[1::2]) * np.sin(alpha))
        bound = np.linalg.norm(q) * np.linalg.norm(k) * (16 * (m + n + s + 1) * EPS64 + 1e-14)
        for other in (at(q, m + s, theta) @ at(k, n + s, theta), q @ at(k, n - m, theta), closed):
            assert abs(dot - other) <= bound
    # and it does depend on the offset: one position more changes the score
    assert abs(at(q, 3, theta) @ at(k, 1, theta) - at(q, 3, theta) @ at(k, 2, theta)) > 1e-3


def test_a_rotary_network_is_unchanged_by_a_uniform_shift_of_positions():
    """Positions enter a rotary model only through the scores, so the logits of the whole
    network (every layer) are the same at positions s .. s+T-1 as at 0 .. T-1."""
    cfg = ModelConfig(**ROPE_MODEL, block_size=8)
    params = rope_weights(cfg, 3)
    idx = np.random.default_rng(4).integers(0, cfg.vocab_size, (2, 8))
    logits, _, _ = gpt_forward(params, cfg, idx)
    for s in (1, 37, 1000):
        shifted, _, _ = gpt_forward(params, cfg, idx, pos_ids=np.arange(s, s + 8)[None] + 0 * idx)
        np.testing.assert_allclose(shifted, logits, rtol=0, atol=1e-11)
    sinusoidal = ModelConfig(**{**ROPE_MODEL, "pos_encoding": "sinusoidal"}, block_size=48)
    params = rope_weights(sinusoidal, 3)
    a, _, _ = gpt_forward(params, sinusoidal, idx)
    b, _, _ = gpt_forward(params, sinusoidal, idx, pos_ids=np.arange(37, 45)[None] + 0 * idx)
    assert np.abs(a - b).max() > 1e-3  # absolute positions: a shift changes everything


def test_rope_backward_is_the_transposed_jacobian_and_the_opposite_turn():
    rng = np.random.default_rng(5)
    shape, pos = (1, 2, 3, 8), slice(4, 7)
    x, dy = rng.standard_normal(shape), rng.standard_normal(shape)
    angles = rope.rope_angles(pos, 8, 10000.0, np.float64)
    h, n = 1e-6, x.size
    jacobian = np.empty((n, n))
    for j in range(n):  # column j: central difference along coordinate j
        e = np.zeros(n)
        e[j] = h
        e = e.reshape(shape)
        jacobian[:, j] = ((rope.rope_forward(x + e, angles) - rope.rope_forward(x - e, angles))
                          / (2 * h)).reshape(-1)
    dx = rope.rope_backward(dy, angles)
    np.testing.assert_allclose(dx.reshape(-1), jacobian.T @ dy.reshape(-1), atol=1e-9)
    # R_p^T = R_{-p}: the backward is the forward at the opposite positions
    np.testing.assert_allclose(dx, turn(dy, -np.arange(4, 7)[None]), rtol=0, atol=1e-15)


@pytest.mark.parametrize("dk", [4, 8, 64])
def test_rotate_half_is_the_interleaved_rotation_of_renumbered_coordinates(dk):
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    rng = np.random.default_rng(dk)
    T, start = 5, 900
    x = rng.standard_normal((1, 3, T, dk))
    perm = np.concatenate([np.arange(0, dk, 2), np.arange(1, dk, 2)])
    angle = np.arange(start, start + T)[:, None] * rope_frequencies(dk, 10000.0)
    cos, sin = (torch.tensor(np.concatenate([f(angle)] * 2, axis=-1))[None]
                for f in (np.cos, np.sin))  # HF's layout: the angles repeated over the halves
    x_hf = torch.tensor(x[..., perm])
    hf, _ = apply_rotary_pos_emb(x_hf, x_hf, cos, sin)
    np.testing.assert_allclose(hf.numpy(), turn(x, slice(start, start + T))[..., perm],
                               rtol=0, atol=1e-12)


def test_sliding_window_reaches_n_layer_windows_back():
    """With the band mask i - T < j <= i in every layer, the last position's logits depend on
    the token n_layer (T - 1) back, and on none before it."""
    T = 4
    cfg = ModelConfig(**ROPE_MODEL, block_size=T)
    params = rope_weights(cfg, 6)
    idx = np.random.default_rng(7).integers(0, cfg.vocab_size, (1, 12))
    last, _, _ = gpt_forward(params, cfg, idx)
    reach = cfg.n_layer * (T - 1)
    for back, changes in ((reach, True), (reach + 1, False)):
        other = idx.copy()
        other[0, -1 - back] = (other[0, -1 - back] + 1) % cfg.vocab_size
        logits, _, _ = gpt_forward(params, cfg, other)
        assert (np.abs(logits[0, -1] - last[0, -1]).max() > 1e-6) == changes, back


def test_rmsnorm_gradient_identities():
    """dx = r (g - x̂ mean(g x̂)) keeps x̂ . dx = r sum(g x̂) eps / (mean(x^2) + eps) (zero when
    eps = 0) but not sum(dx) = 0: nothing was centred."""
    rng = np.random.default_rng(8)
    x, gamma, dy = rng.standard_normal((3, 6)), rng.standard_normal(6), rng.standard_normal((3, 6))
    for eps in (0.0, 0.5):
        _, cache = rmsnorm_forward(x.copy(), gamma, eps)
        dx, _ = rmsnorm_backward(dy, cache)
        ms, r, xhat, g = (x * x).mean(1), cache.rstd[:, 0], cache.xhat, dy * gamma
        expected = r * (g * xhat).sum(1) * eps / (ms + eps)
        np.testing.assert_allclose((xhat * dx).sum(1), expected, rtol=1e-12, atol=1e-14)
        assert np.abs(dx.sum(1)).min() > 1e-3


def test_silu_symmetries_minimum_and_derivative():
    x = np.linspace(-6, 6, 241)
    y, cache = L.silu_forward(x)
    grad = L.silu_backward(np.ones_like(x), cache)
    np.testing.assert_allclose(y - L.silu_forward(-x)[0], x, atol=1e-14)  # silu(x) - silu(-x) = x
    np.testing.assert_allclose(grad + L.silu_backward(np.ones_like(x), (-x, L.sigmoid(-x))), 1.0,
                               atol=1e-14)
    h = 1e-6
    central = (L.silu_forward(x + h)[0] - L.silu_forward(x - h)[0]) / (2 * h)
    np.testing.assert_allclose(grad, central, atol=1e-8)
    fine = np.linspace(-1.5, -1.0, 50001)
    lowest = np.argmin(L.silu_forward(fine)[0])
    assert fine[lowest] == pytest.approx(-1.2785, abs=1e-4)
    assert L.silu_forward(fine)[0][lowest] == pytest.approx(-0.2785, abs=1e-4)


@pytest.mark.parametrize("H,H_kv", [(4, 2), (6, 3), (8, 1), (2, 2)])
def test_the_group_sum_is_the_adjoint_of_the_copy(H, H_kv):
    """<repeat(k), dy> = <k, sum over the group of dy>, for every k and dy."""
    rng = np.random.default_rng(H * 10 + H_kv)
    k, dy = rng.standard_normal((2, H_kv, 3, 4)), rng.standard_normal((2, H, 3, 4))
    repeated = att.repeat_kv_forward(k, H // H_kv)
    assert [h // (H // H_kv) for h in range(H)] == [
        int(np.flatnonzero([np.array_equal(repeated[:, h], k[:, g]) for g in range(H_kv)])[0])
        for h in range(H)]
    np.testing.assert_allclose(np.sum(repeated * dy),
                               np.sum(k * att.repeat_kv_backward(dy, H // H_kv)), rtol=1e-13)

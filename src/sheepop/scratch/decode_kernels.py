"""A decode step's work between its products, compiled by numba: one token, one row, each call
the arithmetic the NumPy layers do for it in ten-odd array operations (sheepop.scratch.decode_step
calls them; the products are sheepop.scratch.narrow's kernels).

    rms_norm_row       y = gamma * x / sqrt(mean(x^2) + eps)                (norm.py)
    add_rms_norm_row   x += a, then y = rms_norm(x)                          (block.py's x + a)
    attend_row         q, k turned by RoPE; k, v written to the cache's column; for each head
                       y_h = softmax(q_h K_g^T / sqrt(d_k)) V_g, g = h // (H / H_kv)
                                                                 (rope.py, attention.py)
    silu_mul_row       y = silu(g) * u = g / (1 + e^-g) * u                  (ffn.py, layers.py)

Why: at one row the NumPy layers' arrays hold a few hundred numbers, and each array operation
costs its call (~1 us), not its arithmetic: SmolLM2's 30 layers made ~1,200 of them a token,
2-3 ms beside the products' 4 ms (docs/performance.md). Each function here is the same formula
in the same order of operations as the NumPy unit it stands for; its float32 sums run in
another order (vector lanes), so the two agree within float32's rounding of a sum, not bit for
bit (tests/scratch/test_decode_step.py).

The settings are the product kernels' serial ones (sheepop.scratch.narrow_kernels.SERIAL):
cached on disk, float32 sums reordered into lanes, no bounds checks (the caller passes checked
shapes).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from sheepop.scratch.narrow_kernels import INLINED, SERIAL


@njit(**INLINED)
def _rms_norm(x: np.ndarray, gamma: np.ndarray, eps: float, y: np.ndarray) -> None:
    total = np.float32(0.0)
    for i in range(x.shape[0]):
        total += x[i] * x[i]
    rstd = np.float32(1.0) / np.sqrt(total / np.float32(x.shape[0]) + np.float32(eps))
    for i in range(x.shape[0]):
        y[i] = x[i] * rstd * gamma[i]


@njit(**SERIAL)
def rms_norm_row(x: np.ndarray, gamma: np.ndarray, eps: float, y: np.ndarray) -> None:
    """y = gamma * x / sqrt(mean(x^2) + eps) for x (d,) float32, into y (d,)."""
    _rms_norm(x, gamma, eps, y)


@njit(**SERIAL)
def add_rms_norm_row(x: np.ndarray, a: np.ndarray, gamma: np.ndarray, eps: float,
                     y: np.ndarray) -> None:
    """x += a (the residual stream takes a branch's output, in place), then y = rms_norm(x)."""
    for i in range(x.shape[0]):
        x[i] += a[i]
    _rms_norm(x, gamma, eps, y)


@njit(**INLINED)
def _turn(x: np.ndarray, start: int, cos: np.ndarray, sin: np.ndarray) -> None:
    """Each interleaved pair (x_2i, x_2i+1) of the head at x[start:] turned by its angle, in
    place: (x_2i cos - x_2i+1 sin, x_2i sin + x_2i+1 cos) (rope.rope_forward's complex
    product)."""
    for i in range(cos.shape[0]):
        a, b = x[start + 2 * i], x[start + 2 * i + 1]
        x[start + 2 * i] = a * cos[i] - b * sin[i]
        x[start + 2 * i + 1] = a * sin[i] + b * cos[i]


@njit(**SERIAL)
def attend_row(qkv: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, column: int,
               keys: int, cos: np.ndarray, sin: np.ndarray, n_head: int, y: np.ndarray) -> None:
    """One token's attention. qkv (H + 2 H_kv) d_k: its queries, keys and values side by side
    (split_qk_v's columns), the queries and keys turned in place; k_cache, v_cache (H_kv,
    capacity, d_k), this layer's buffers, take the new key and value at `column`; each head h
    attends over the first `keys` columns of key/value head h // (H / H_kv):

        y_h = softmax(q_h K^T / sqrt(d_k)) V          into y[h d_k:(h + 1) d_k]

    (one query sees every key: no mask). cos and sin (d_k / 2,) are the position's angles."""
    n_kv, dk = k_cache.shape[0], k_cache.shape[2]
    group = n_head // n_kv
    for h in range(n_head + n_kv):  # the queries, then the keys
        _turn(qkv, h * dk, cos, sin)
    for g in range(n_kv):
        for i in range(dk):
            k_cache[g, column, i] = qkv[(n_head + g) * dk + i]
            v_cache[g, column, i] = qkv[(n_head + n_kv + g) * dk + i]
    scale = np.float32(1.0 / math.sqrt(dk))
    scores = np.empty(keys, np.float32)
    for h in range(n_head):
        g = h // group
        top = np.float32(-np.inf)
        for j in range(keys):
            s = np.float32(0.0)
            for i in range(dk):
                s += qkv[h * dk + i] * k_cache[g, j, i]
            s *= scale
            scores[j] = s
            top = max(top, s)
        total = np.float32(0.0)
        for j in range(keys):
            scores[j] = np.exp(scores[j] - top)
            total += scores[j]
        for i in range(dk):
            y[h * dk + i] = 0.0
        for j in range(keys):
            p = scores[j] / total
            for i in range(dk):
                y[h * dk + i] += p * v_cache[g, j, i]


@njit(**SERIAL)
def silu_mul_row(g: np.ndarray, u: np.ndarray, y: np.ndarray) -> None:
    """y = silu(g) * u, silu(g) = g / (1 + e^-g) (layers.silu_forward: g times the sigmoid;
    below g ~ -88 e^-g is infinite and silu(g) is 0, its limit)."""
    for i in range(g.shape[0]):
        y[i] = g[i] * (np.float32(1.0) / (np.float32(1.0) + np.exp(-g[i]))) * u[i]


KERNELS = (rms_norm_row, add_rms_norm_row, attend_row, silu_mul_row)
"""What numba compiles when called from Python (the helpers inline into them)."""

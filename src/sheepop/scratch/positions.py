"""Position encodings of the NumPy engine, one per `model.pos_encoding` kind.

A kind acts in one or both of two places (docs/math/03-positions.md):

    embed       h0 = E[x] + P[pos]                      (sinusoidal, learned)
    rotate      q, k -> R(pos) q, R(pos) k per head     (inside attention: rope)

`pos` is a slice (positions start .. start+T-1 for every row) or an index array (B, T) (each
row of a left-padded batch counts from its own first real token). A `PositionKind` names its
parameters and its forward/backward pairs (None where it does nothing); the torch engine's
units are in sheepop/model/positions.py.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any, NamedTuple

import numpy as np

from sheepop.config import ModelConfig
from sheepop.positional import rope_frequencies, sinusoidal_table

Pos = slice | np.ndarray
Params = dict[str, np.ndarray]


@lru_cache(maxsize=8)
def sinusoidal(n_positions: int, d: int, scale: float, dtype: str) -> np.ndarray:
    """s * P, P the shared sinusoidal table (sheepop.positional), in the model's dtype, computed
    once. s = cfg.sinusoid_scale (1/sqrt(d) by default, so the table does not drown the
    N(0, 0.02) token embeddings)."""
    table = (sinusoidal_table(n_positions, d) * scale).astype(dtype)
    table.setflags(write=False)
    return table


def sinusoidal_positions_forward(params: Params, cfg: ModelConfig, pos: Pos, dtype: np.dtype
                                 ) -> tuple[np.ndarray, None]:
    """out = s * P[pos], a fixed table: nothing to learn, nothing cached."""
    return sinusoidal(cfg.block_size, cfg.n_embd, cfg.sinusoid_scale, np.dtype(dtype).name)[pos], \
        None


class PositionCache(NamedTuple):
    pos: Pos
    n_positions: int


def learned_positions_forward(table: np.ndarray, pos: Pos) -> tuple[np.ndarray, PositionCache]:
    """out = P[pos]: (T, d) for a slice, added to every sequence of the batch; (B, T, d) for
    per-row positions."""
    return table[pos], PositionCache(pos, table.shape[0])


def learned_positions_backward(dout: np.ndarray, cache: PositionCache) -> np.ndarray:
    """dP[p] = sum of dout over every (row, t) at position p (the lookup's adjoint; for a slice,
    the broadcast's adjoint sums over the batch); 0 at positions not used."""
    d = dout.shape[-1]
    dtable = np.zeros((cache.n_positions, d), dtype=dout.dtype)
    if isinstance(cache.pos, slice):
        rows = dtable[cache.pos]
        rows += dout.reshape(-1, len(rows), d).sum(axis=0)
    else:
        np.add.at(dtable, cache.pos.reshape(-1), dout.reshape(-1, d))
    return dtable


class RopeCache(NamedTuple):
    cos: np.ndarray      # (T, d_k/2), or (B, 1, T, d_k/2) for per-row positions
    sin: np.ndarray


def rope_angles(pos: Pos, head_dim: int, theta: float, dtype: np.dtype) -> RopeCache:
    """cos and sin of the angles p omega_i for every position p asked and pair i, computed in
    float64 (any position exists) and given in the model's dtype; per-row positions (B, T)
    get a head axis to broadcast over."""
    p = np.arange(pos.start, pos.stop) if isinstance(pos, slice) else np.asarray(pos)[:, None]
    angle = p[..., None].astype(np.float64) * rope_frequencies(head_dim, theta)
    return RopeCache(np.cos(angle).astype(dtype), np.sin(angle).astype(dtype))


def rope_forward(x: np.ndarray, cache: RopeCache) -> np.ndarray:
    """Turn each interleaved pair (x_2i, x_2i+1) of x (B, H, T, d_k) by its angle:

        x'_2i   = x_2i cos - x_2i+1 sin
        x'_2i+1 = x_2i sin + x_2i+1 cos          (R(p omega_i) applied to the pair)"""
    even, odd = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = even * cache.cos - odd * cache.sin
    out[..., 1::2] = even * cache.sin + odd * cache.cos
    return out


def rope_backward(dout: np.ndarray, cache: RopeCache) -> np.ndarray:
    """dx = R^T dout: a rotation's Jacobian is the rotation itself, whose transpose is the
    rotation by the opposite angle (cos unchanged, sin negated)."""
    return rope_forward(dout, RopeCache(cache.cos, -cache.sin))


def rope_rotate_forward(q: np.ndarray, k: np.ndarray, pos: Pos, cfg: ModelConfig
                        ) -> tuple[np.ndarray, np.ndarray, RopeCache]:
    """Queries and keys turned by their positions (the same angles for both)."""
    angles = rope_angles(pos, cfg.head_dim, cfg.rope_theta, q.dtype)
    return rope_forward(q, angles), rope_forward(k, angles), angles


def rope_rotate_backward(dq: np.ndarray, dk: np.ndarray, cache: RopeCache
                         ) -> tuple[np.ndarray, np.ndarray]:
    return rope_backward(dq, cache), rope_backward(dk, cache)


class PositionKind(NamedTuple):
    params: Callable[[ModelConfig], dict[str, tuple[int, ...]]]
    embed_forward: Callable[[Params, ModelConfig, Pos, np.dtype], tuple[np.ndarray, Any]] | None
    embed_backward: Callable[[np.ndarray, Any], Params] | None
    # rotate_forward(q, k, pos, cfg) -> (q, k, cache); rotate_backward(dq, dk, cache) -> (dq, dk)
    rotate_forward: Callable | None = None
    rotate_backward: Callable | None = None


POSITIONS = {
    "sinusoidal": PositionKind(lambda cfg: {}, sinusoidal_positions_forward, None),
    "learned": PositionKind(
        lambda cfg: {"pos_emb.weight": (cfg.block_size, cfg.n_embd)},
        lambda params, cfg, pos, dtype: learned_positions_forward(params["pos_emb.weight"], pos),
        lambda dout, cache: {"pos_emb.weight": learned_positions_backward(dout, cache)}),
    "rope": PositionKind(lambda cfg: {}, None, None, rope_rotate_forward, rope_rotate_backward),
}

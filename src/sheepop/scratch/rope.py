"""Rotary positions (RoPE) of the NumPy engine: queries and keys turned by their positions.

    z'_i = z_i e^{i p omega_i},   z_i = x_2i + i x_2i+1,   omega_i = theta^(-2i/d_k)

Each interleaved pair of a query or key head, read as a complex number, is multiplied by
e^{i p omega_i}: the rotation of the pair by the angle p omega_i (RoFormer's form). The backward
pass multiplies by the conjugate, the rotation by the opposite angle. The `rope`, `rope_terms`
and `rope_places` kinds of sheepop.scratch.positions turn by this unit, by positions, term
indices or (term index, digit place) pairs; the torch engine's is `RotaryPositions` in
sheepop/model/positions.py. Derivation: docs/derivations/positions.md.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from sheepop.config.schema import ModelConfig
from sheepop.positional import place_rope_frequencies, rope_frequencies

Pos = slice | np.ndarray
COMPLEX = {np.dtype(np.float32): np.dtype(np.complex64),
           np.dtype(np.float64): np.dtype(np.complex128)}
"""The complex type whose numbers are pairs of a real type's values."""


class RopeCache(NamedTuple):
    turn: np.ndarray  # e^{i p omega} = cos + i sin, complex of the model's width: (T, d_k/2),
    #                   or (B, 1, T, d_k/2) for per-row positions

    @property
    def cos(self) -> np.ndarray:
        return self.turn.real

    @property
    def sin(self) -> np.ndarray:
        return self.turn.imag


def rope_cache(cos: np.ndarray, sin: np.ndarray) -> RopeCache:
    turn = np.empty(cos.shape, COMPLEX[cos.dtype])
    turn.real, turn.imag = cos, sin
    return RopeCache(turn)


def rope_angles(pos: Pos, head_dim: int, theta: float, dtype: np.dtype) -> RopeCache:
    """cos and sin of the angles p omega_i for every position p asked and pair i, computed in
    float64 (any position exists) and given in the model's dtype; per-row positions (B, T)
    get a head axis to broadcast over; `rope_places` positions (B, T, 2) turn pair i by (n, r)
    W (sheepop.positional.place_rope_frequencies). Per-row positions repeat (every training
    window has the same terms), so the angles are computed once per distinct position and
    gathered: the same float64 products as computing them all."""
    if isinstance(pos, slice):
        angle = np.arange(pos.start, pos.stop)[:, None].astype(np.float64) * \
            rope_frequencies(head_dim, theta)
        return rope_cache(np.cos(angle).astype(dtype), np.sin(angle).astype(dtype))
    p = np.asarray(pos)
    pairs = p.ndim == 3  # (B, T, 2): rope_places' (term index, digit place)
    flat = p.reshape(-1, 2) if pairs else p.reshape(-1, 1)
    distinct, which = np.unique(flat, axis=0, return_inverse=True)
    u = distinct.astype(np.float64)
    if pairs:
        w = place_rope_frequencies(head_dim, theta)
        angle = u[:, 0:1] * w[0] + u[:, 1:2] * w[1]
    else:
        angle = u[:, 0:1] * rope_frequencies(head_dim, theta)
    shape = (p.shape[0], 1, p.shape[1], head_dim // 2)  # a head axis to broadcast over
    which = which.reshape(-1)
    return rope_cache(np.cos(angle).astype(dtype)[which].reshape(shape),
                      np.sin(angle).astype(dtype)[which].reshape(shape))


def rope_forward(x: np.ndarray, cache: RopeCache) -> np.ndarray:
    """Turn each interleaved pair (x_2i, x_2i+1) of x (B, H, T, d_k) by its angle:

        x'_2i   = x_2i cos - x_2i+1 sin
        x'_2i+1 = x_2i sin + x_2i+1 cos          (R(p omega_i) applied to the pair)

    which is the complex product z' = z e^{i p omega_i} of z = x_2i + i x_2i+1 (RoFormer's
    form): the pairs read as complex numbers in place, one array operation."""
    if x.strides[-1] != x.itemsize:  # the complex view needs each pair side by side
        x = np.ascontiguousarray(x)
    turned = x.view(COMPLEX[x.dtype]) * cache.turn  # NumPy's promotion, as for real arrays
    return turned.view(turned.real.dtype)


def rope_backward(dout: np.ndarray, cache: RopeCache) -> np.ndarray:
    """dx = R^T dout: a rotation's Jacobian is the rotation itself, whose transpose is the
    rotation by the opposite angle: the product with the conjugate e^{-i p omega_i}."""
    return rope_forward(dout, cache._replace(turn=cache.turn.conj()))


_last_angles: tuple | None = None  # (positions, (d_k, theta, dtype), RopeCache)


def rope_rotate_forward(qk: np.ndarray, pos: Pos, cfg: ModelConfig
                        ) -> tuple[np.ndarray, RopeCache]:
    """Queries and keys, stacked on the head axis (B, H + H_kv, T, d_k), turned by their
    positions: every head turns by the same angles, so one rotation turns both (in a decode
    step each array operation saved counts). Every layer of a forward pass asks for the same
    positions (the same object): the angles of the last call are reused."""
    global _last_angles
    key = (cfg.head_dim, cfg.rope_theta, qk.dtype)
    last = _last_angles
    if last is not None and last[1] == key and (
            last[0] is pos or (isinstance(pos, slice) and isinstance(last[0], slice)
                               and last[0] == pos)):
        angles = last[2]
    else:
        angles = rope_angles(pos, cfg.head_dim, cfg.rope_theta, qk.dtype)
        _last_angles = (pos, key, angles)
    return rope_forward(qk, angles), angles


def rope_rotate_backward(dqk: np.ndarray, cache: RopeCache) -> np.ndarray:
    """d(queries and keys), stacked as rope_rotate_forward stacks them: R^T dout."""
    return rope_backward(dqk, cache)

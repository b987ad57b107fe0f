"""The numbers behind the position kinds, shared by both engines: the sinusoidal table and the
rotary frequencies.

    P[pos, 2i]   = sin(pos / 10000^(2i / d))
    P[pos, 2i+1] = cos(pos / 10000^(2i / d))

Column pair i is a sine/cosine of wavelength 2*pi * 10000^(2i/d): from 2*pi (i = 0) up to nearly
2*pi * 10000, so every position up to a very long context gets a distinct code, and
P[pos + k] is a fixed rotation of P[pos] for every offset k.
"""

from __future__ import annotations

import numpy as np


def sinusoidal_table(n_positions: int, d: int, base: float = 10000.0) -> np.ndarray:
    """Return P of shape (n_positions, d) in float64 (d must be even)."""
    pos = np.arange(n_positions, dtype=np.float64)[:, None]
    two_i = np.arange(0, d, 2, dtype=np.float64)[None, :]
    angle = pos / base ** (two_i / d)
    table = np.empty((n_positions, d), dtype=np.float64)
    table[:, 0::2] = np.sin(angle)
    table[:, 1::2] = np.cos(angle)
    return table


def rope_frequencies(head_dim: int, theta: float = 10000.0) -> np.ndarray:
    """omega_i = theta^(-2i / d_k), i = 0 .. d_k/2 - 1, in float64: the angular speed of pair i.

    RoPE turns pair i of a query or key at position p by the angle p * omega_i (the same
    frequencies as the sinusoidal table's columns, with d_k in place of d)."""
    return theta ** -(np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)

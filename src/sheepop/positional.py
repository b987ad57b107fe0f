"""The sinusoidal positional-encoding table, shared by both engines.

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

"""Logit soft-capping, forward and backward (docs/derivations/head-and-loss.md).

    y = c tanh(z / c)                 every logit squashed smoothly into (-c, c)
    dz = dy (1 - tanh^2(z / c)) = dy (1 - (y / c)^2)

Near 0 it is the identity (tanh u ~ u), so only logits that grow towards c are held back: a
model cannot make one token's logit run away (Gemma 2 caps at 30, modded-nanogpt at 15). The
cache is t = tanh(z / c); cap 0 is off (the identity, no cache). The torch engine's unit is
`sheepop.model.softcap.softcap`.
"""

from __future__ import annotations

import numpy as np


def softcap_forward(z: np.ndarray, cap: float) -> tuple[np.ndarray, np.ndarray | None]:
    """(c tanh(z / c), t = tanh(z / c)); (z, None) when cap is 0."""
    if not cap:
        return z, None
    t = np.tanh(z / z.dtype.type(cap))
    return t * z.dtype.type(cap), t


def softcap_backward(dy: np.ndarray, t: np.ndarray | None) -> np.ndarray:
    """dz = dy (1 - t^2), tanh's derivative (the c of the forward and the 1/c inside cancel)."""
    if t is None:
        return dy
    return dy * (1 - t * t)

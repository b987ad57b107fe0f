"""softmax, written once for everything in NumPy (the torch engine calls torch.softmax): the
NumPy engine's attention weights (sheepop.scratch.attention), the sampler's distribution
(sheepop.generation.sample), the page's views (sheepop.arch.inspection, sheepop.arch.trace) and
the loss's probabilities in the backward step the page shows (sheepop.train.backward_step).

    softmax(z)_i = exp(z_i - m) / sum_j exp(z_j - m),      m = max_j z_j

Subtracting the row's maximum changes nothing (numerator and denominator are both multiplied by
exp(-m)) and keeps every exponent <= 0, so exp never overflows, and the largest term is
exp(0) = 1, so the sum is at least 1. An entry at -inf (a masked key, a never-generated token)
gets exactly 0, as long as one entry of its row is finite (docs/math/04-attention.md, 4.3).
"""

from __future__ import annotations

import numpy as np


def softmax(z: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """softmax(z) over the last axis, in z's dtype (a float64 distribution: pass float64 z);
    `out=z` computes it in place (the attention's (B, H, T, T) scores, no second array)."""
    out = np.subtract(z, z.max(axis=-1, keepdims=True), out=out)
    np.exp(out, out=out)
    out /= out.sum(axis=-1, keepdims=True)
    return out

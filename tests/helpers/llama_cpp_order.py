"""llama.cpp's sampler chain, as a reference to compare sheepop's with (issue 41).

llama.cpp (common/sampling: the default chain penalties, DRY, top-n-sigma, top-k, typical-p,
top-p, min-p, XTC, temperature, then the draw) applies its filters to the logits as they are
and divides by the temperature last:

    keep the k largest z_i;
    top-p on softmax(z) of those kept: the smallest prefix, most likely first, reaching p;
    min-p: keep p_i >= m max p (p = softmax(z) at temperature 1: z_i >= z_max + ln m);
    q = softmax(z / tau) over what is left.

sheepop (sheepop.generation.sample) divides by tau first, as transformers does. With the other
settings off (DRY, typical-p, XTC and top-n-sigma are off by default in llama.cpp) this is the
whole of llama.cpp's rule.
"""

from __future__ import annotations

import numpy as np


def llama_cpp_probabilities(z: np.ndarray, temperature: float, top_k: int = 0,
                            top_p: float = 1.0, min_p: float = 0.0) -> np.ndarray:
    """The distribution llama.cpp draws the next token from, for one row of logits."""
    z = np.asarray(z, dtype=np.float64)
    keep = np.ones(z.shape, dtype=bool)
    if 0 < top_k < z.size:
        keep[np.argsort(-z, kind="stable")[top_k:]] = False
    p = np.where(keep, np.exp(z - z[keep].max()), 0.0)
    p /= p.sum()
    if top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        before = np.cumsum(p[order]) - p[order]
        keep[order[before >= top_p]] = False
    if min_p > 0.0:
        keep &= p >= min_p * p.max()
    q = np.where(keep, np.exp((z - z[keep].max()) / temperature), 0.0)
    return q / q.sum()

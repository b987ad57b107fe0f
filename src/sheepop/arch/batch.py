"""Left padding for batched generation, and which keys each query may see.

Prompts of different lengths share one (B, L) array, each right-aligned so that every row's
next token goes in the same column. Two rules keep the padding from changing any row's output:

- positions count from each row's first real token: pos[b, t] = t - pad_b (padding: 0), so a
  prompt sees the same positional encoding as when it runs alone;
- a real query never sees a padding key: allowed[q, k] = (k <= q) and real[k], or k == q.

The `k == q` term lets a padding query see itself, so no row of the attention matrix is all
-inf (a NaN after softmax); what padding positions compute is discarded.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sheepop.arch import PAD_ID


def left_pad(rows: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Token ids (B, L) right-aligned, position ids (B, L) and the real-token mask (B, L)."""
    if not rows or any(len(r) == 0 for r in rows):
        raise ValueError("every row of a batch needs at least one token")
    L = max(len(r) for r in rows)
    idx = np.full((len(rows), L), PAD_ID, dtype=np.int64)
    real = np.zeros((len(rows), L), dtype=bool)
    for b, row in enumerate(rows):
        idx[b, L - len(row):] = list(row)
        real[b, L - len(row):] = True
    pos = np.maximum(np.cumsum(real, axis=1) - 1, 0)
    return idx, pos, real


def allowed_keys(T: int, past: int, key_mask: np.ndarray | None = None,
                 window: int | None = None) -> np.ndarray:
    """Boolean mask of the keys each of T queries may see; the queries sit at positions
    past .. past+T-1 and the keys at 0 .. past+T-1.

    Without `key_mask`: causal, (T, past+T), allowed[i, j] = j <= past + i; with `window` W
    also past + i - j < W (sliding-window attention: the last W keys, the query's own
    included; what a rolling KV cache computes, sheepop.arch.kv_cache).
    With `key_mask` (B, >= past+T), True at real tokens: (B, 1, T, past+T), causal and real
    keys only, and every query sees itself (see the module docstring)."""
    q_pos = np.arange(past, past + T)[:, None]
    k_pos = np.arange(past + T)[None, :]
    causal = k_pos <= q_pos
    if window is not None:
        causal &= q_pos - k_pos < window
    if key_mask is None:
        return causal
    return ((causal & key_mask[:, None, :past + T]) | (k_pos == q_pos))[:, None]

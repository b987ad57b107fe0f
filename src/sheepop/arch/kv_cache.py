"""The key/value cache's bookkeeping; each engine allocates the two buffers in its own arrays.

During generation the keys and values of earlier positions never change (attention is causal),
so every layer stores them in a preallocated (B, H, T_max, d_k) slice and a decode step computes
Q, K, V for the new token only. Writing in place (no concatenation) makes a step cost one
position's work and no reallocation. Memory per token: 2 * n_layer * H * d_k elements.

The code below indexes and assigns only, so it works on NumPy arrays and torch tensors alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sheepop.config import ModelConfig


def cache_shape(cfg: ModelConfig, batch: int, max_len: int | None = None) -> tuple[int, ...]:
    """(n_layer, B, H, T_max, d_k): one buffer for all keys (another for all values)."""
    return (cfg.n_layer, batch, cfg.n_head, max_len or cfg.block_size, cfg.head_dim)


class KVCache:
    """Keys `k` and values `v`, (n_layer, B, H, T_max, d_k) each; `length` positions filled."""

    def __init__(self, k: Any, v: Any):
        self.k, self.v = k, v
        self.max_len = k.shape[3]
        self.length = 0  # the same for every layer

    @property
    def batch(self) -> int:
        return self.k.shape[1]

    def reset(self) -> None:
        self.length = 0

    def update(self, layer: int, k_new: Any, v_new: Any) -> tuple[Any, Any]:
        """Store (B, H, t, d_k) keys/values after the cached ones; return all of them (views).

        The length advances in `advance`, once every layer has stored its part."""
        start, end = self.length, self.length + k_new.shape[2]
        if end > self.max_len:
            raise ValueError(f"KV cache full: {end} positions > max_len {self.max_len}")
        self.k[layer, :, :, start:end] = k_new
        self.v[layer, :, :, start:end] = v_new
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]

    def advance(self, t: int) -> None:
        self.length += t

    def keep_rows(self, rows: Sequence[int]) -> None:
        """Keep only these batch rows, in this order (finished sequences leave the batch)."""
        rows = list(rows)
        self.k, self.v = self.k[:, rows], self.v[:, rows]

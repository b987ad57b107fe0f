"""The key/value cache's bookkeeping; each engine allocates the two buffers in its own arrays.

During generation the keys and values of earlier positions never change (attention is causal),
so every layer stores them in a preallocated (B, H_kv, T_max, d_k) slice and a decode step
computes Q, K, V for the new token only. Writing in place (no concatenation) makes a step cost
one position's work and no reallocation. Memory per token: 2 * n_layer * H_kv * d_k elements
(H_kv = model.kv_heads: grouped-query attention stores fewer heads than it queries).

Past the context. With absolute positions (sinusoidal, learned) a position past the table does
not exist, so a full cache cannot take another token: the generation loop drops the oldest
tokens of its window a chunk at a time and refills the cache with the rest, at positions from 0
(sheepop.generate, `window_start`). With rotary positions attention depends only on the offset
between a query and a key, so the cache becomes a ring (`rolling`): once all T_max columns are
filled, each new token overwrites the oldest, and every query attends over the T_max most recent
keys, each rotated by its own absolute position. The reference this computes exactly is
sliding-window attention over the whole sequence: query i sees key j iff i - T_max < j <= i, in
every layer (`sheepop.arch.batch.allowed_keys` with `window`; docs/inference.md). The order of
the columns is then no longer the order of the positions, which attention does not need: softmax
is a sum over keys, and each key carries its position in its rotation.

The code below indexes and assigns only, so it works on NumPy arrays and torch tensors alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sheepop.config import ModelConfig
from sheepop.layer_kinds import POSITION_KINDS


def cache_shape(cfg: ModelConfig, batch: int, max_len: int | None = None) -> tuple[int, ...]:
    """(n_layer, B, H_kv, T_max, d_k): one buffer for all keys (another for all values)."""
    return (cfg.n_layer, batch, cfg.kv_heads, max_len or cfg.block_size, cfg.head_dim)


def slides(cfg: ModelConfig) -> bool:
    """Whether a full cache of this model can roll on (relative positions: rope)."""
    return POSITION_KINDS[cfg.pos_encoding] == "relative"


class KVCache:
    """Keys `k` and values `v`, (n_layer, B, H_kv, T_max, d_k) each; `length` tokens seen (the
    absolute position of the next one; with `rolling`, it may pass T_max)."""

    def __init__(self, k: Any, v: Any, rolling: bool = False):
        self.k, self.v = k, v
        self.max_len = k.shape[3]
        self.rolling = rolling
        self.length = 0  # the same for every layer
        # Digit places / term indices (sheepop.model.positions.DigitPositions): each row's
        # (run of digits, numbers ended) so far, (B, 2), for the next call to continue.
        self.digit_run: Any = None

    @property
    def batch(self) -> int:
        return self.k.shape[1]

    def reset(self) -> None:
        self.length = 0

    @property
    def full(self) -> bool:
        return self.length >= self.max_len

    def column(self) -> int:
        """The column the next single token is written to: the oldest one in a full ring."""
        return self.length % self.max_len

    def query_offset(self, t: int) -> int:
        """Where t new queries sit among the key columns, for the causal rule: after the cached
        columns, or, in a full ring (t = 1), at the last column: every column then holds an
        earlier key or the new token's own, all of which it may see."""
        return min(self.length, self.max_len - t)

    def update(self, layer: int, k_new: Any, v_new: Any) -> tuple[Any, Any]:
        """Store (B, H_kv, t, d_k) keys/values after the cached ones; return all of them (views).

        A full rolling cache takes one token at a time, over its oldest column. The length
        advances in `advance`, once every layer has stored its part."""
        t = k_new.shape[2]
        start, end = self.length, self.length + t
        if end > self.max_len:
            if not (self.rolling and self.full and t == 1):
                raise ValueError(f"KV cache full: {end} positions > max_len {self.max_len}")
            start, end = self.column(), self.column() + 1
        self.k[layer, :, :, start:end] = k_new
        self.v[layer, :, :, start:end] = v_new
        end = min(self.length + t, self.max_len)
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]

    def advance(self, t: int) -> None:
        self.length += t

    def keep_rows(self, rows: Sequence[int]) -> None:
        """Keep only these batch rows, in this order (finished sequences leave the batch)."""
        rows = list(rows)
        self.k, self.v = self.k[:, rows], self.v[:, rows]
        if self.digit_run is not None:
            self.digit_run = self.digit_run[rows]

"""The key/value cache's bookkeeping; each engine allocates the two buffers in its own arrays.

During generation the keys and values of earlier positions never change (attention is causal),
so every layer stores them in a (B, H_kv, capacity, d_k) slice and a decode step computes Q, K,
V for the new token only, written in place (no concatenation): a step costs one position's
work. Memory per token: 2 * n_layer * H_kv * d_k elements (H_kv = model.kv_heads: grouped-query
attention stores fewer heads than it queries).

Growth. The buffers hold `capacity` columns, not the whole context T_max: a cache starts with
none, and a write past the capacity reallocates once (`reserve`, `grown`): to the tokens needed
rounded up to GROWTH_CHUNK columns, or twice the capacity if that is more, at most T_max. The
filled columns are copied over. Each copy is at most the capacity it leaves, and capacities at
least double, so n tokens cost fewer than 2n columns of copies in all (c + c/2 + c/4 + ... < 2c,
c < n the last capacity left), about log2(n / GROWTH_CHUNK) reallocations, and a capacity below
max(2n, n + GROWTH_CHUNK). A 2,000-token generation of a model with
a context of 8,192 holds 2,048 columns, not 8,192. The engine's `allocate(shape)` hook makes the
buffers, uninitialised; the cache zeroes every column it does not copy (zeros, not what the
memory held: a padding column is read under a mask, and 0 * NaN would be NaN), except the ones
a caller promises to write before anything reads them (`reserve(..., unwritten=)`: a prompt's
own prefill, whose 196 MB of zeros for 4,000 tokens of SmolLM2 took 0.09-0.15 s on one core,
every running stream stalled for it); everything else here only indexes and assigns, so it
works on NumPy arrays and torch tensors alike. A cache made without a hook has a fixed capacity
(max_len).

Past the context. With absolute positions (sinusoidal, learned) a position past the table does
not exist, so a full cache cannot take another token: the generation loop drops the oldest
tokens of its window a chunk at a time and refills the cache with the rest, at positions from 0
(`sheepop.generation.generate.window_start`). With rotary positions attention depends only on the
offset between a query and a key, so the cache becomes a ring (`rolling`): once all T_max columns
are filled (growth has reached T_max by then), each new token overwrites the oldest, and every query
attends over the T_max most recent keys, each rotated by its own absolute position. The
reference this computes exactly is sliding-window attention over the whole sequence: query i
sees key j iff i - T_max < j <= i, in every layer (`sheepop.arch.batch.allowed_keys` with
`window`; docs/inference.md). The order of the columns is then no longer the order of the
positions, which attention does not need: softmax is a sum over keys, and each key carries its
position in its rotation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sheepop.config.layer_kinds import POSITION_KINDS
from sheepop.config.schema import ModelConfig

# The smallest step of a cache's capacity, in columns (positions): a prompt of p tokens starts
# with p rounded up to it. 64 columns of SmolLM2 (30 layers, 3 kv heads of 64) are 2.8 MiB.
GROWTH_CHUNK = 64

Allocate = Callable[[tuple[int, ...]], Any]
"""An engine's allocation hook: shape -> an uninitialised buffer in its arrays, dtype and device
(the cache zeroes what it must: `KVCache.resize`)."""


def cache_shape(cfg: ModelConfig, batch: int, max_len: int | None = None) -> tuple[int, ...]:
    """(n_layer, B, H_kv, T, d_k): one buffer for all keys (another for all values); T is
    `max_len` columns, the whole context (block_size) when None."""
    T = cfg.block_size if max_len is None else max_len
    return (cfg.n_layer, batch, cfg.kv_heads, T, cfg.head_dim)


def copied(block: Any) -> Any:
    """A copy of an array or tensor (a slice kept past its buffer's next write, or a shift
    within one buffer, which must not read what it wrote)."""
    return block.clone() if hasattr(block, "clone") else block.copy()


def slides(cfg: ModelConfig) -> bool:
    """Whether a full cache of this model can roll on (relative positions: rope)."""
    return POSITION_KINDS[cfg.pos_encoding] == "relative"


def grown(capacity: int, needed: int, limit: int, chunk: int = GROWTH_CHUNK) -> int:
    """The capacity after asking for `needed`: `capacity` when it holds them, else the larger of
    `needed` rounded up to a multiple of `chunk` and 2 * capacity, at most `limit`."""
    if needed <= capacity:
        return capacity
    return min(limit, max(chunk * -(-needed // chunk), 2 * capacity))


def shrunk(capacity: int, needed: int, limit: int, chunk: int = GROWTH_CHUNK) -> int:
    """The capacity once only `needed` are in use: 0 for none; 2 * needed rounded up to `chunk`
    when `capacity` is at least 4x max(needed, chunk); else `capacity`. (Shrinking at 4x to 2x
    while `grown` doubles: a need hovering near a boundary does not copy at every step.)"""
    if needed == 0:
        return 0
    if capacity < 4 * max(needed, chunk):
        return capacity
    return min(limit, chunk * -(-2 * needed // chunk))


class KVCache:
    """Keys `k` and values `v`, (n_layer, B, H_kv, capacity, d_k) each; `length` tokens seen
    (the absolute position of the next one; with `rolling`, it may pass max_len). With an
    `allocate` hook the capacity grows on demand up to `max_len` (default: k's columns)."""

    def __init__(self, k: Any, v: Any, rolling: bool = False, max_len: int | None = None,
                 allocate: Allocate | None = None):
        self.k, self.v = k, v
        self.max_len = k.shape[3] if max_len is None else max_len
        self.allocate = allocate
        self.rolling = rolling
        self.length = 0  # the same for every layer
        # Digit places / term indices (sheepop.model.positions.DigitPositions): each row's
        # (run of digits, numbers ended) so far, (B, 2), for the next call to continue.
        self.digit_run: Any = None
        self.peak_bytes = self.nbytes  # the most ever held at once (growth included)

    @classmethod
    def growing(cls, cfg: ModelConfig, batch: int, allocate: Allocate,
                max_len: int | None = None) -> KVCache:
        """An empty cache for `batch` sequences of up to `max_len` (default block_size)
        positions, whose buffers `allocate` makes as the tokens come."""
        empty = cache_shape(cfg, batch, 0)
        return cls(allocate(empty), allocate(empty), slides(cfg),
                   cfg.block_size if max_len is None else max_len, allocate)

    @property
    def batch(self) -> int:
        return self.k.shape[1]

    @property
    def capacity(self) -> int:
        """The columns allocated now (max_len at most)."""
        return self.k.shape[3]

    @property
    def nbytes(self) -> int:
        """The bytes the two buffers hold now (`nbytes` of NumPy arrays and torch tensors)."""
        return int(self.k.nbytes + self.v.nbytes)

    def reset(self) -> None:
        """Start again at position 0 (the buffers are kept for the next tokens)."""
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

    def layer(self, index: int) -> KVCache:
        """Layer `index`'s part as a one-layer cache (its layer 0) over the same buffers, at the
        same length: its writes land here; it cannot grow (`make_room` first). A compiled
        block takes it, so that every layer's call is one graph: given the whole cache and the
        index, torch.compile made the index a constant of the graph and compiled each layer
        again (up to its recompile limit of 8, then ran the rest eagerly)."""
        part = KVCache(self.k[index:index + 1], self.v[index:index + 1], self.rolling,
                       self.max_len)
        part.length = self.length
        return part

    def update(self, layer: int, k_new: Any, v_new: Any) -> tuple[Any, Any]:
        """Store (B, H_kv, t, d_k) keys/values after the cached ones; return all of them (views).

        A full rolling cache takes one token at a time, over its oldest column. The first layer
        to need more columns grows the buffers of every layer (`reserve`). The length advances in
        `advance`, once every layer has stored its part."""
        t = k_new.shape[2]
        start, end = self.written(t)
        self.k[layer, :, :, start:end] = k_new
        self.v[layer, :, :, start:end] = v_new
        end = min(self.length + t, self.max_len)
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]

    def written(self, t: int) -> tuple[int, int]:
        """The columns start..end that t new tokens are written to (`update`'s rule), room made:
        after the cached ones, or, in a full ring, one token over the oldest column. An engine
        that writes a token's column itself (sheepop.scratch.decode_step) asks here; it then
        attends over the first min(length + 1, max_len) columns."""
        start, end = self.length, self.length + t
        if end > self.max_len:
            if not (self.rolling and self.full and t == 1):
                raise ValueError(f"KV cache full: {end} positions > max_len {self.max_len}")
            return self.column(), self.column() + 1
        if end > self.capacity:
            self.reserve(end)
        return start, end

    def advance(self, t: int) -> None:
        self.length += t

    def make_room(self, t: int) -> None:
        """Grow now for t more tokens (a full ring, or a cache they would overflow, is left to
        `update`): for an engine that must not allocate inside its forward pass."""
        if self.length + t <= self.max_len:
            self.reserve(self.length + t)

    def reserve(self, columns: int, unwritten: int = 0) -> None:
        """Room for `columns` columns: grown (`grown`) when the capacity is less; `unwritten`:
        see `resize`."""
        if columns > self.capacity:
            if self.allocate is None or columns > self.max_len:
                raise ValueError(f"KV cache full: {columns} positions > capacity "
                                 f"{self.capacity if self.allocate is None else self.max_len}")
            self.resize(self.batch, grown(self.capacity, columns, self.max_len),
                        unwritten=unwritten)

    def resize(self, rows: int, columns: int, keep_rows: int | None = None,
               keep_columns: int | None = None, unwritten: int = 0) -> None:
        """New buffers of `rows` rows and `columns` columns, holding the first `keep_rows` rows'
        first `keep_columns` columns of the old ones (default: every row, the filled columns),
        as far as they fit, and zeros elsewhere but in the `unwritten` columns after the kept
        ones, which the caller writes in every kept row before any is read (left as allocated).
        The old buffers live until the copy is done: the peak counts both."""
        if self.allocate is None:
            raise ValueError("this KV cache has a fixed size (it was made without `allocate`)")
        n_layer, _, heads, _, width = self.k.shape
        r = min(rows, self.batch if keep_rows is None else keep_rows)
        filled = min(self.length, self.capacity) if keep_columns is None else keep_columns
        c = min(columns, filled)
        before = self.nbytes
        shape = (n_layer, rows, heads, columns, width)
        k, v = self.allocate(shape), self.allocate(shape)
        for new, old in ((k, self.k), (v, self.v)):
            if r and c:
                new[:, :r, :, :c] = old[:, :r, :, :c]
            new[:, :r, :, c + unwritten:] = 0
            new[:, r:] = 0
        self.k, self.v = k, v
        self.peak_bytes = max(self.peak_bytes, before + self.nbytes)

    def keep_rows(self, rows: Sequence[int]) -> None:
        """Keep only these batch rows, in this order (finished sequences leave the batch)."""
        rows = list(rows)
        self.k, self.v = self.k[:, rows], self.v[:, rows]
        if self.digit_run is not None:
            self.digit_run = self.digit_run[rows]


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n:,.2f} GiB"


def describe_memory(cache: KVCache) -> str:
    """'KV cache: 2,048 of 8,192 positions allocated, 94.5 MiB (peak 141.8 MiB; the whole
    context: 377.5 MiB)': what a cache holds now, the most it held at once (a growth holds the
    old and the new buffers for a moment), and what a cache preallocated to max_len would hold."""
    per_column = cache.nbytes // cache.capacity if cache.capacity else 0
    return (f"KV cache: {cache.capacity:,} of {cache.max_len:,} positions allocated, "
            f"{_size(cache.nbytes)} (peak {_size(cache.peak_bytes)}; the whole context: "
            f"{_size(per_column * cache.max_len)})")

"""Continuous batching: sequences join and leave a running batch at any decode step.

A server (sheepop.serve) keeps one batch of sequences decoding together: every step appends one
token to each of them, and a new request should not wait for the batch to drain, nor a finished
one hold its row. `RunningBatch` is that batch, on top of an engine's `CachedLM`, in either
engine (it only indexes and assigns the cache's buffers, which are NumPy arrays or torch tensors).

Layout. One KV cache (`store`) of up to `capacity` rows and T_max = block_size columns. The rows
in use are the first `rows`; a sequence leaving moves the last row into its place (one row's
copy), so the running rows are always one contiguous view. The columns are shared: every step
writes column `length` in every row, as a left-padded batch does (sheepop.arch.batch). Row b
holds its tokens in the contiguous columns start_b .. length-1, so

    key_mask[b, c] = c >= start_b          (the columns before start_b are padding)
    pos[b]         = length - start_b      (positions count from the row's own first token)

and the engine's existing padded-batch arithmetic (`_logits` with pos_ids and key_mask) computes
every row exactly as if it ran alone: the same positions, the same visible keys.

Joining. New prompts are prefilled together as one left-padded batch in a cache of their own,
then their keys and values are copied into free rows, right-aligned on column `length`: a prompt
of p tokens takes columns length-p .. length-1. A prompt longer than `length` first shifts every
running row right (the batch grows on the left with padding columns). A prompt prefilled apart
(`place`: a chunk at a time, from a prefix cache, sheepop.generation.prefill) joins the same way.

Room. A row never holds more than T_max tokens (the server checks prompt + max_tokens), but the
shared column counter grows with the oldest running row. When it reaches T_max, or when the
columns no row uses (those before min_b start_b) become a quarter of it, every row shifts left by
min_b start_b (compaction), so `length` is the longest running row's span and attention never
reads more columns than that.

Memory. The store holds only what the running rows need (`_fit`): rows and columns grow when a
join or a step needs more (doubling, sheepop.arch.kv_cache.grown) and shrink once four times
more than needed is held (`shrunk`); an empty batch holds nothing. So its bytes follow the
tokens in flight, rows x the longest running span, within a factor of four.

Speculation. While a single row runs, it may append several tokens in one pass (`verify`) and
give back the columns of those rejected (`rollback`): the `ProposalChecker` of speculative
decoding (sheepop.generation.speculative.check_pass). With more rows it may not (`room` 0):
every row writes the same columns, so rows keeping different numbers of tokens would break the
layout above.

Besides keys and values, a cache may carry per-row state that the next call reads (`ROW_STATE`:
the digit places' run of digits, `KVCache.digit_run`); it follows its row in and out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from sheepop.arch.batch import left_pad
from sheepop.arch.kv_cache import KVCache, copied, grown, shrunk
from sheepop.arch.packed import Part
from sheepop.generation.cached_lm import CachedLM
from sheepop.generation.prefill import Prefill

ROW_STATE = ("digit_run",)  # (B, ...) values a KVCache carries for each row, besides K, V


class RunningBatch:
    """Up to `capacity` sequences decoding together; they join (`join`) and leave (`leave`)
    between any two steps (`step`)."""

    def __init__(self, lm: CachedLM, capacity: int):
        if capacity < 1:
            raise ValueError(f"a running batch needs at least one row, not {capacity}")
        self.lm = lm
        self.capacity = capacity
        self.store = lm._new_cache(0, lm.block_size)  # no rows, no columns: `_fit` sizes it
        self.max_len = self.store.max_len
        self.rows = 0
        self.length = 0  # the next column every row writes
        self.start = np.zeros(capacity, dtype=np.int64)  # each row's first real column
        self.state: dict[str, Any] = {}  # ROW_STATE name -> (capacity, ...) array or tensor

    @property
    def free(self) -> int:
        return self.capacity - self.rows

    def spans(self) -> np.ndarray:
        """The number of tokens each running row holds (prompt and generated so far)."""
        return self.length - self.start[:self.rows]

    # ----- joining ---------------------------------------------------------------------------
    def join(self, prompts: Sequence[Sequence[int]], copies: Sequence[int] | None = None
             ) -> np.ndarray:
        """Prefill `prompts` together and add them as the last rows, prompt i as `copies[i]`
        consecutive rows (default 1: n > 1 sequences of one prompt share its prefill). Returns
        the logits (len(prompts), V) after each prompt's last token."""
        copies = [1] * len(prompts) if copies is None else list(copies)
        if len(copies) != len(prompts) or min(copies, default=1) < 1:
            raise ValueError("one number of copies >= 1 for each prompt")
        if sum(copies) > self.free:
            raise ValueError(f"{sum(copies)} rows asked, {self.free} free")
        if any(len(p) > self.max_len for p in prompts):
            raise ValueError(f"a prompt longer than the context ({self.max_len})")
        idx, pos, real = left_pad(prompts)
        fresh = self.lm._new_cache(len(prompts), idx.shape[1])
        padding = {} if real.all() else {"pos_ids": pos, "key_mask": real}
        logits = self.lm._prefill(idx, fresh, **padding)
        self._place(fresh, [len(p) for p in prompts], copies)
        return logits

    def place(self, prefill: Prefill, copies: int = 1) -> None:
        """Add a finished `Prefill` (one prompt, prefilled apart, e.g. a chunk at a time) as
        `copies` consecutive last rows. An empty batch takes a single copy's cache as its
        store, without copying it (a long prompt in a lane of its own, sheepop.generation.lanes:
        4,000 tokens of SmolLM2 are 186 MB)."""
        if not prefill.finished:
            raise ValueError(f"the prompt's prefill has {prefill.left} tokens left")
        if copies > self.free:
            raise ValueError(f"{copies} rows asked, {self.free} free")
        fresh = prefill.cache
        if self.rows == 0 and copies == 1 and fresh.max_len == self.max_len:
            self.store = KVCache(fresh.k, fresh.v, fresh.rolling, fresh.max_len, fresh.allocate)
            self.store.peak_bytes = fresh.peak_bytes
            self.length, self.start[0], self.rows = fresh.length, 0, 1
            for name, values in self._row_state(fresh).items():
                values[0] = getattr(fresh, name)[0]
            return
        self._place(fresh, [len(prefill.prompt)], [copies])

    def _place(self, fresh: KVCache, lengths: Sequence[int], copies: Sequence[int]) -> None:
        """Copy each row i of `fresh` (a prompt of lengths[i] tokens, right-aligned on its
        last column) into copies[i] new last rows, right-aligned on column `length`."""
        L = fresh.length
        if self.rows == 0:
            self.length = 0
        self._fit(self.rows + sum(copies), max(L, self.length))
        if L > self.length:  # room on the left for the longest new prompt
            self._shift_right(L - self.length)
        lo, r = self.length - L, self.rows
        for i, n in enumerate(copies):
            for buf, new in ((self.store.k, fresh.k), (self.store.v, fresh.v)):
                buf[:, r:r + n, :, lo:self.length] = new[:, i:i + 1, :, :L]
            self.start[r:r + n] = self.length - lengths[i]
            for name, values in self._row_state(fresh).items():
                values[r:r + n] = getattr(fresh, name)[i]
            r += n
        self.rows = r

    def row_keys(self, row: int) -> tuple[Any, Any]:
        """Row `row`'s keys and values (n_layer, H_kv, span, d_k), from its first token."""
        cols = slice(int(self.start[row]), self.length)
        return self.store.k[:, row, :, cols], self.store.v[:, row, :, cols]

    # ----- one decode step -------------------------------------------------------------------
    def step(self, tokens: Sequence[int], chunks: Sequence[tuple[Prefill, int]] = ()
             ) -> np.ndarray:
        """Append token b to row b, for every running row; the logits (rows, V) after them.

        `chunks` (prefill, n): the next n tokens of each of these prompts computed in the same
        forward pass (`CachedLM.mixed`, sheepop.arch.packed: the weights read once for the step
        and the chunks), each prefill advanced (its logits set once it is finished); they join
        the batch afterwards (`place`)."""
        if len(tokens) != self.rows or self.rows == 0:
            raise ValueError(f"{len(tokens)} tokens for {self.rows} running rows")
        if chunks:
            return step_together([self], tokens, chunks)
        return self._append(np.asarray(list(tokens), dtype=np.int64)[:, None], last_only=True)

    def _append(self, x: np.ndarray, last_only: bool = False) -> np.ndarray:
        """Append x[b] (T tokens) to row b, for every running row, in one pass; the logits
        (rows, T, V) after each of them (`last_only`: (rows, V) after the last: a decode step's
        own pass, the one a compiled model has traced)."""
        part = self._part(x)
        padding = {} if part.pos_ids is None else {"pos_ids": part.pos_ids,
                                                   "key_mask": part.key_mask}
        logits = self.lm._logits(x, part.cache, last_only=last_only, **padding)
        self._appended(part)
        return logits

    def _part(self, x: np.ndarray) -> Part:
        """x[b] (T tokens) for row b, for every running row, as a pass's part: the rows' cache
        (a view of the store, room made for them), and where some row has padding its
        per-row positions and visible keys (else positions are columns, nothing hidden)."""
        B, T = x.shape
        self._make_room(T)
        self._fit(B, self.length + T)
        cache = KVCache(self.store.k[:, :B], self.store.v[:, :B])
        cache.length = self.length
        for name, values in self.state.items():
            setattr(cache, name, values[:B])
        start = self.start[:B]
        if not start.any():
            return Part(x, cache)
        columns = np.arange(self.length + T)
        return Part(x, cache, (self.length - start)[:, None] + np.arange(T),
                    columns[None, :] >= start[:, None])

    def _appended(self, part: Part) -> None:
        """After `part`'s pass: the rows' state copied back (the engine rebinds it), the shared
        column counter past its tokens."""
        for name, values in self.state.items():
            values[:part.idx.shape[0]] = getattr(part.cache, name)
        self.length += part.idx.shape[1]

    # ----- speculative decoding while one sequence runs: a ProposalChecker -------------------
    def room(self) -> int:
        """The tokens `verify` may still append to the lone running row: what is left of the
        context after its span. 0 while other rows run (every row advances by the same columns
        at each step) or rows carry state (digit places: a run of digits does not roll back)."""
        if self.rows != 1 or self.state:
            return 0
        return self.max_len - int(self.spans()[0])

    def verify(self, ids: Sequence[int]) -> np.ndarray:
        """Append `ids` to the lone running row in one pass; the logits (len(ids), V) after
        each (sheepop.generation.speculative.check_pass)."""
        if not 0 < len(ids) <= self.room():
            raise ValueError(f"{len(ids)} tokens to check, room for {self.room()}")
        return self._append(np.asarray(list(ids), dtype=np.int64)[None, :])[0]

    def rollback(self, n: int) -> None:
        """Forget the lone row's last n tokens (rejected proposals): the next tokens overwrite
        their columns, and no query reads them before."""
        if n and self.rows != 1:
            raise ValueError(f"a rollback needs one running row, not {self.rows}")
        self.length -= n

    def decode(self, token: int) -> np.ndarray:
        """Append one token to the lone running row; the logits (V,) after it."""
        return self.step([token])[0]

    def _row_state(self, fresh: KVCache) -> dict[str, Any]:
        """The per-row state buffers, made on the first join whose cache carries some."""
        for name in ROW_STATE:
            new = getattr(fresh, name, None)
            if new is not None and name not in self.state:
                # A (capacity,) buffer of the engine's own type, array or tensor alike.
                self.state[name] = new[[0] * self.capacity]  # (indexing copies)
        return self.state

    def _make_room(self, tokens: int = 1) -> None:
        """Columns for `tokens` more in every row: the unused ones dropped when they are
        needed or a quarter of the span (compaction)."""
        unused = int(self.start[:self.rows].min())
        if self.length + tokens > self.max_len or (unused >= 8 and 4 * unused >= self.length):
            self._shift_left(unused)
        if self.length + tokens > self.max_len:
            raise ValueError("a running row fills the whole context: it must leave first")

    # ----- leaving ---------------------------------------------------------------------------
    def leave(self, rows: Sequence[int]) -> list[int]:
        """Drop these rows. The last rows move into the holes; returns the new order: row i is
        the old row order[i]."""
        gone = set(rows)
        if not gone <= set(range(self.rows)):
            raise ValueError(f"rows {sorted(gone)} are not all running (0..{self.rows - 1})")
        order = list(range(self.rows))
        keep = self.rows - len(gone)
        movers = [r for r in range(keep, self.rows) if r not in gone]
        for hole in sorted(r for r in gone if r < keep):
            src = movers.pop()
            for buf in (self.store.k, self.store.v):
                buf[:, hole, :, :self.length] = buf[:, src, :, :self.length]
            self.start[hole] = self.start[src]
            for values in self.state.values():
                values[hole] = values[src]
            order[hole] = src
        self.rows = keep
        if keep == 0:
            self.length = 0
        self._fit(keep, self.length + 1 if keep else 0)
        return order[:keep]

    # ----- memory ----------------------------------------------------------------------------
    def _fit(self, rows: int, columns: int) -> None:
        """Size the store for `rows` rows of `columns` columns: grow what is short, shrink what
        is four times too large; the running rows' filled columns are copied over."""
        store = self.store
        r = shrunk(grown(store.batch, rows, self.capacity, 1), rows, self.capacity, 1)
        c = shrunk(grown(store.capacity, columns, self.max_len), columns, self.max_len)
        if (r, c) != (store.batch, store.capacity):
            store.resize(r, c, self.rows, self.length)

    @property
    def nbytes(self) -> int:
        """The bytes of keys and values held now."""
        return self.store.nbytes

    @property
    def peak_bytes(self) -> int:
        """The most bytes of keys and values held at once so far (growth included)."""
        return self.store.peak_bytes

    # ----- moving columns --------------------------------------------------------------------
    def _shift_right(self, by: int) -> None:
        """Every running row's columns move `by` to the right (padding grows on the left)."""
        B, n = self.rows, self.length
        if B and n:
            for buf in (self.store.k, self.store.v):
                buf[:, :B, :, by:by + n] = copied(buf[:, :B, :, :n])
        self.start[:B] += by
        self.length += by

    def _shift_left(self, by: int) -> None:
        """Drop the first `by` columns, which no running row uses."""
        if by <= 0:
            return
        B, n = self.rows, self.length - by
        for buf in (self.store.k, self.store.v):
            buf[:, :B, :, :n] = copied(buf[:, :B, :, by:self.length])
        self.start[:B] -= by
        self.length = n


def step_together(batches: Sequence[RunningBatch], tokens: Sequence[int],
                  chunks: Sequence[tuple[Prefill, int]] = ()) -> np.ndarray:
    """One decode step of every row of these batches (their rows end to end: token b for row
    b) and the next n tokens of each prefill in `chunks`, in one forward pass (`CachedLM.mixed`,
    sheepop.arch.packed: a part for each batch, over its own columns, and one for each chunk);
    the rows' logits (rows, V) in order; each prefill advanced (its logits set once it is
    finished)."""
    x = np.asarray(list(tokens), dtype=np.int64)[:, None]
    bounds = np.cumsum([0] + [b.rows for b in batches])
    if len(x) != bounds[-1] or len(x) == 0:
        raise ValueError(f"{len(x)} tokens for {bounds[-1]} running rows")
    steps = [b._part(x[lo:hi]) for b, lo, hi in zip(batches, bounds[:-1], bounds[1:])]
    parts = [prefill.part(n) for prefill, n in chunks]
    logits = batches[0].lm.mixed([*steps, *parts])
    for b, part in zip(batches, steps):
        b._appended(part)
    for (prefill, _), part, z in zip(chunks, parts, logits[len(steps):]):
        prefill.advanced(part, z[0])
    return np.concatenate(logits[:len(steps)])

"""The next-token interface of the generation loops (`sheepop.generation.generate`), written once.

An engine subclasses `CachedLM` and supplies the arithmetic:

    _new_cache(batch, max_len) -> KVCache          buffers in the engine's arrays
    _logits(idx, cache, pos_ids, key_mask) -> (B, V) NumPy float32 logits after each row's
        last token; `idx` (B, T) continues the `cache` (None: no cache), which advances by T;
        with last_only=False, (B, T, V): after every position (a prompt's own log-probabilities);
        `additions` (layer -> array) added to block layer's output at every position (steering)
    _packed_logits(packed) -> (R, V) after each row's last token of every part of a `Packed`
        pass (sheepop.arch.packed), each part's cache advanced by its tokens

Everything else, one sequence (`prefill`/`decode`/`full`, the `LanguageModel` protocol) or a
batch of left-padded sequences (`prefill_batch`/`decode_batch`/`full_batch`/`keep_rows`, the
`BatchLanguageModel` protocol), is the bookkeeping below, and so is evaluation (`loss_sum`,
through the same cache). `never_generate` lists the token ids the generation loops must never
draw (padding, BOS, unknown: see `sheepop.inference.load`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np

from sheepop.arch import IGNORE_INDEX
from sheepop.arch.batch import left_pad
from sheepop.arch.kv_cache import KVCache
from sheepop.arch.packed import Packed, Part
from sheepop.generation.steering import Steering, row_additions

# Positions per forward pass of a prompt or an evaluation (all rows together): a pass holds
# their logits, CHUNK_ROWS x V (SmolLM2: 100 MB), and one layer's attention scores,
# CHUNK_ROWS x H x T (SmolLM2 at 8,192 keys: 150 MB; a whole 8,192-token prompt at once: 2.4 GB).
CHUNK_ROWS = 512


class CachedLM:
    block_size: int

    def __init__(self, block_size: int, never_generate: Sequence[int] = (),
                 slides: bool = False):
        self.block_size = block_size
        self.never_generate: tuple[int, ...] = tuple(never_generate)
        # Rotary positions: a full cache rolls on (sheepop.arch.kv_cache), so `decode` continues
        # past the context at one token's cost; otherwise the loops refill a sliding window.
        self.slides = slides
        self.cache: KVCache
        # Batch state: a cache of B rows, which key columns hold real tokens, each row's next
        # position (rows count positions from their own first real token), any padding at all.
        self.batch_cache: KVCache | None = None
        self._key_mask: np.ndarray | None = None
        self._next_pos: np.ndarray | None = None
        self._padded = False
        # Steering (sheepop.generation.steering): layer -> the array every pass adds to block
        # layer's output, (1, 1, d) for one steering of every row or (B, 1, d) row by row.
        self.additions: dict[int, np.ndarray] = {}

    # ----- the engine's arithmetic ---------------------------------------------------------
    def _new_cache(self, batch: int, max_len: int | None = None) -> KVCache:
        raise NotImplementedError

    def _logits(self, idx: np.ndarray, cache: KVCache | None, pos_ids: np.ndarray | None = None,
                key_mask: np.ndarray | None = None, last_only: bool = True) -> np.ndarray:
        raise NotImplementedError

    def _packed_logits(self, packed: Packed) -> np.ndarray:
        raise NotImplementedError

    @property
    def mixes(self) -> bool:
        """Whether `mixed` may put several sequences in one pass: unless an engine says not
        (digit places: a run of digits each row's state)."""
        return True

    def mixed(self, parts: Sequence[Part]) -> list[np.ndarray]:
        """Each part's logits (B_i, V) after its rows' last tokens, from one forward pass over
        all their tokens (sheepop.arch.packed: a running batch's decode step and the chunks of
        the prompts joining it); each part's cache then holds its tokens. A steering set row
        by row (`steered_rows`) has one row for each row of the parts, in order."""
        assert self.mixes, "this model cannot mix sequences in one pass (CachedLM.mixes)"
        packed = Packed(parts, self.block_size)
        before = self.additions
        self.additions = {layer: packed.per_token(a) for layer, a in before.items()}
        try:
            return packed.split(self._packed_logits(packed))
        finally:
            self.additions = before

    def steer(self, steering: Steering | None) -> None:
        """Add `steering` at every position of every pass from now on (None: no more). The
        cache's tokens were computed under the steering before: the next `prefill` reuses
        none of them."""
        self.additions = {} if steering is None else {
            layer: a[None, None] for layer, a in steering.additions().items()}
        self._cache_ids = []

    @contextmanager
    def steered_rows(self, rows: Sequence[Steering | None]) -> Iterator[None]:
        """Each row of the passes inside steered its own way (the server's requests: rows
        of the running batch, prompts prefilled together); they must hold len(rows) rows.
        The steering before is back after it."""
        before, self.additions = self.additions, row_additions(rows)
        try:
            yield
        finally:
            self.additions = before

    def _new_caches(self) -> None:
        """A fresh single-sequence cache, and no batch cache yet (an engine calls this once its
        model is ready, and again when the model's dtype or device changes)."""
        self.cache = self._new_cache(1)
        self._cache_ids: list[int] = []  # the tokens `cache` holds, in order (prompt reuse)
        self.reused = 0  # the tokens the last `prefill` kept from the one before
        self.batch_cache = None

    # ----- one sequence: sheepop.generation.protocol.LanguageModel ----------------------------
    @property
    def cache_length(self) -> int:
        return self.cache.length

    @staticmethod
    def _row(ids: Sequence[int]) -> np.ndarray:
        return np.asarray(list(ids), dtype=np.int64)[None, :]

    def _chunks(self, idx: np.ndarray, cache: KVCache, pos_ids: np.ndarray | None = None,
                key_mask: np.ndarray | None = None, last_only: bool = True
                ) -> Iterator[tuple[int, np.ndarray]]:
        """(start, `_logits` of positions start..) over `idx` (B, T), CHUNK_ROWS // B positions
        a pass, each pass continuing `cache`: the numbers of one pass (a cached forward over
        the positions before it is exact) with CHUNK_ROWS positions' scores held at a time.
        `pos_ids` (B, T) and `key_mask` (B, cached + T) are sliced to each pass."""
        T, past = idx.shape[1], cache.length
        step = max(1, CHUNK_ROWS // idx.shape[0])
        for s in range(0, T, step):
            padding = {} if pos_ids is None else {"pos_ids": pos_ids[:, s:s + step],
                                                  "key_mask": key_mask[:, :past + s + step]}
            yield s, self._logits(idx[:, s:s + step], cache, last_only=last_only, **padding)

    def _prefill(self, idx: np.ndarray, cache: KVCache, pos_ids: np.ndarray | None = None,
                 key_mask: np.ndarray | None = None) -> np.ndarray:
        """Logits (B, V) after the last position of `idx` (B, T), which `cache` then holds,
        computed in passes of CHUNK_ROWS positions (`_chunks`)."""
        return [logits for _, logits in self._chunks(idx, cache, pos_ids, key_mask)][-1]

    def prefill(self, ids: Sequence[int]) -> np.ndarray:
        """Make the cache hold `ids`; the logits (V,) after the last of them.

        The tokens the cache already holds are kept as far as they are a prefix of `ids`
        (`reused` of them; at most all but the last): a conversation's next turn computes only
        what follows what was said before (`sheepop chat`). Attention is causal, so the kept
        keys and values are those a fresh cache would compute (docs/serve.md, "Prompt
        reuse")."""
        ids = list(ids)
        self.reused = self._reusable(ids)
        self.cache.length = self.reused
        self._cache_ids = ids
        return self._prefill(self._row(ids[self.reused:]), self.cache)[0]

    def _reusable(self, ids: list[int]) -> int:
        """How many of the cached tokens `prefill(ids)` keeps: their common prefix with `ids`,
        but the last of `ids`; none when the columns are not the tokens in order (a ring that
        rolled on) or the cache carries state a shorter prefix would not have (digit places)."""
        cache, held = self.cache, self._cache_ids
        if cache.length != len(held) or cache.length > cache.max_len or \
                cache.digit_run is not None:
            return 0
        n = 0
        for a, b in zip(held, ids[:-1]):
            if a != b:
                break
            n += 1
        return n

    def decode(self, token: int) -> np.ndarray:
        """Append one token to the cache; the logits (V,) after it."""
        self._cache_ids.append(token)
        return self._logits(self._row([token]), self.cache)[0]

    # ----- speculative decoding: sheepop.generation.protocol.CheckingLanguageModel -----------
    def room(self) -> int:
        """The tokens `verify` may still append: the columns left before the context is full;
        0 where a rollback would be wrong (a ring that rolled on overwrote the columns it would
        give back; digit places carry the run of digits in the cache's state)."""
        cache = self.cache
        if cache.digit_run is not None or cache.length != len(self._cache_ids):
            return 0
        return max(0, cache.max_len - cache.length)

    def verify(self, ids: Sequence[int]) -> np.ndarray:
        """Append `ids` to the cache in one forward pass; the logits (len(ids), V) after each
        of them (a causal pass over them continuing the cache: row j is what `decode` would
        give after ids[j], up to the rounding of a wider product)."""
        assert len(ids) <= self.room(), "verify past the cache's room"
        self._cache_ids.extend(ids)
        return self._logits(self._row(ids), self.cache, last_only=False)[0]

    def rollback(self, n: int) -> None:
        """Forget the last n tokens of the cache (rejected proposals): its length goes back,
        so the next tokens overwrite their columns and no query reads them before."""
        if n:
            self.cache.length -= n
            del self._cache_ids[-n:]

    def full(self, ids: Sequence[int]) -> np.ndarray:
        """The logits (V,) after the last of `ids`, recomputed without a cache."""
        return self._logits(self._row(ids), None)[0]

    # ----- a batch of sequences (left padding): sheepop.generation.protocol.BatchLanguageModel
    @property
    def batch_length(self) -> int:
        """Columns filled in the batch cache (the longest row's length, padding included)."""
        return self.batch_cache.length if self.batch_cache is not None else 0

    @staticmethod
    def _padding(pos: np.ndarray, real: np.ndarray) -> dict[str, np.ndarray]:
        return {} if real.all() else {"pos_ids": pos, "key_mask": real}

    def prefill_batch(self, rows: Sequence[Sequence[int]]) -> np.ndarray:
        """Start a fresh batch cache holding `rows` (left-padded); logits (B, V) after each."""
        idx, pos, real = left_pad(rows)
        B, L = idx.shape
        if self.batch_cache is None or self.batch_cache.batch != B:
            self.batch_cache = self._new_cache(B)
        self.batch_cache.reset()
        self._padded = not bool(real.all())
        self._key_mask = np.zeros((B, self.batch_cache.max_len), dtype=bool)
        self._key_mask[:, :L] = real
        self._next_pos = np.array([len(r) for r in rows], dtype=np.int64)
        return self._prefill(idx, self.batch_cache, **self._padding(pos, real))

    def decode_batch(self, tokens: Sequence[int]) -> np.ndarray:
        """Append one token to every row of the batch cache; logits (B, V) after them."""
        assert self.batch_cache is not None and self._next_pos is not None, "prefill_batch first"
        x = np.asarray(list(tokens), dtype=np.int64)[:, None]
        cache = self.batch_cache
        kw = {}
        if self._padded:  # the new token's column is real in every row (in a full ring: the
            self._key_mask[:, cache.column()] = True  # oldest, which it overwrites)
            end = min(cache.length + 1, cache.max_len)
            kw = {"pos_ids": self._next_pos[:, None].copy(), "key_mask": self._key_mask[:, :end]}
        logits = self._logits(x, self.batch_cache, **kw)
        self._next_pos += 1
        return logits

    def full_batch(self, rows: Sequence[Sequence[int]]) -> np.ndarray:
        """Logits (B, V) after the last token of each row, recomputed without a kept cache."""
        idx, pos, real = left_pad(rows)
        return self._logits(idx, None, **self._padding(pos, real))

    def keep_rows(self, rows: Sequence[int]) -> None:
        """Keep only these rows of the batch cache (finished sequences leave the batch)."""
        assert self.batch_cache is not None and self._next_pos is not None, "prefill_batch first"
        rows = list(rows)
        self.batch_cache.keep_rows(rows)
        self._key_mask, self._next_pos = self._key_mask[rows], self._next_pos[rows]

    # ----- a prompt's own log-probabilities (the server's echo, sheepop.serve) -------------
    def prompt_logits(self, ids: Sequence[int]) -> np.ndarray:
        """Logits (len(ids), V): row t is the prediction after ids[:t+1] (what a prompt's own
        log-probabilities are read from): one forward pass over the prompt, in a cache of its
        own, keeping every position's logits (`last_only=False`), CHUNK_ROWS at a time."""
        chunks = self._chunks(self._row(ids), self._new_cache(1, len(ids)), last_only=False)
        return np.concatenate([logits[0] for _, logits in chunks])

    # ----- greedy decoding of equal-length contexts (the progression task's evaluation) ----
    def greedy(self, contexts: np.ndarray, n_new: int) -> np.ndarray:
        """The `n_new` tokens (B, n_new) that greedy decoding writes after each row of
        `contexts` (B, T), all rows at once with one cache of T + n_new positions (the
        `never_generate` ids excluded, as in `sheepop.generation.generate`)."""
        x = np.asarray(contexts, dtype=np.int64)
        cache = self._new_cache(len(x), x.shape[1] + n_new)
        out = np.empty((len(x), n_new), dtype=np.int64)
        never = list(self.never_generate)
        for i in range(n_new):
            logits = self._logits(x, cache)
            logits[:, never] = -np.inf
            x = logits.argmax(-1)[:, None]
            out[:, i] = x[:, 0]
        return out

    # ----- evaluation ---------------------------------------------------------------------
    def loss_sum(self, x: np.ndarray, y: np.ndarray) -> tuple[float, int]:
        """(sum of the token losses, number of targets that are not IGNORE_INDEX) on windows
        x, y (B, T). Each window goes through a KV cache of its own, CHUNK_ROWS positions of
        all the windows at a time (`_chunks`), so that neither the logits (rows x V) nor a
        layer's attention weights (rows x H x T) of a long context are held whole (SmolLM2's
        16 windows of 8,192 positions: 26 GB of logits in one pass); attention is causal, so
        the losses are those of one pass over each window."""
        x, y = np.asarray(x), np.asarray(y)
        T = x.shape[1]
        group = max(1, CHUNK_ROWS // T)
        total = 0.0
        for i in range(0, len(x), group):
            xs, ys = x[i:i + group], y[i:i + group]
            for s, logits in self._chunks(xs, self._new_cache(len(xs), T), last_only=False):
                total += token_loss_sum(logits, ys[:, s:s + logits.shape[1]])
        return total, int((y != IGNORE_INDEX).sum())


def token_loss_sum(logits: np.ndarray, targets: np.ndarray) -> float:
    """sum_t (log sum_v e^{z_tv} - z_{t,y_t}) over the targets that are not IGNORE_INDEX: the
    cross-entropy in nats (docs/math/08-loss.md), the log-sum-exp taken after subtracting each
    row's maximum (no overflow), the sum in float64."""
    scored = targets != IGNORE_INDEX
    z = logits[scored]
    top = z.max(axis=-1, keepdims=True)
    lse = top[:, 0] + np.log(np.exp(z - top).sum(axis=-1))
    return float((lse - z[np.arange(len(z)), targets[scored]]).sum(dtype=np.float64))

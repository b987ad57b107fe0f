"""Several sequences' new tokens in one forward pass: a running batch's decode step and the
chunks of the prompts joining it, mixed (docs/serve.md, "Chunked prefill").

A forward pass reads every weight matrix once, whatever the number of tokens it multiplies, and
on a CPU a product of a few rows costs about what one of many rows does (SmolLM2, one thread: a
pass over 16 tokens ~0.50 s, over 64 ~0.61 s), so a decode step of B rows and a chunk of C
prompt tokens cost nearly twice what one pass over their B + C tokens costs. Every unit but
attention works token by token (the embedding, the norms, the products, the feed-forward
network, the head), so the tokens of all the parts are laid end to end in one row (1, N),
N = sum_i B_i T_i, and each engine runs its one forward pass over that row:

    every unit but attention      over the N tokens at once, as over any row
    attention of part i           its tokens a_i .. a_i + B_i T_i - 1 taken as B_i rows of T_i
                                  queries, keys and values; the keys and values stored in part
                                  i's own cache, its queries attending over that cache only,
                                  under part i's own rule (sheepop.arch.batch.allowed_keys)
    positions                     each token its own: its part's pos_ids, or its cache's
                                  length + t
    logits                        after each row's last token only

So each part's numbers are those of a pass of its own, up to the rounding of products of
another width (tests/serve/test_mixed_pass.py). A steering added row by row is added token by
token (`per_token`: each row's addition at each of its tokens). Digit places, whose run of
digits is state a cache carries for each row, run their own passes (`CachedLM.mixes`).

Bookkeeping only (token ranges, positions, masks, each row's last token); the engines split
their own arrays with `rows` and `flat`, which index and reshape NumPy arrays and torch tensors
alike.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from sheepop.arch.batch import allowed_keys
from sheepop.arch.kv_cache import KVCache
from sheepop.positional import uses_digits


def packs(cfg: Any) -> bool:
    """Whether a model's (its ModelConfig's) sequences may share one forward pass: not when its
    positions come from the token ids (digit places, term indices), whose run is state each
    row's cache carries (sheepop.positional.uses_digits)."""
    return not uses_digits(cfg)


class Part(NamedTuple):
    """B rows of T new tokens each that continue `cache` (B rows, `cache.length` tokens held);
    `pos_ids` (B, T) and `key_mask` (B, cache.length + T) as for a left-padded batch
    (sheepop.arch.batch), or None: positions continue the cache, every key is real."""
    idx: np.ndarray
    cache: KVCache
    pos_ids: np.ndarray | None = None
    key_mask: np.ndarray | None = None


Attend = Callable[[Any, Any, Any, Any, int], Any]
"""An engine's attention over one part: (q (B, H, T, d_k), all its keys and values (B, H_kv,
T_keys, d_k) from its cache, its mask (None: the causal rule), its queries' offset among the
keys) -> Y (B, H, T, d_k)."""


class Packed:
    """The parts of one forward pass, their tokens end to end in one row: `idx` and `pos`
    (1, N); `last` (R,), the index of each row's last token, R = sum_i B_i rows in all."""

    def __init__(self, parts: Sequence[Part], block_size: int):
        if not parts:
            raise ValueError("a packed pass needs at least one part")
        self.parts = list(parts)
        sizes = [p.idx.size for p in self.parts]
        self.bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
        self.idx = np.concatenate([p.idx.reshape(-1) for p in self.parts])[None].astype(np.int64)
        self.pos = np.concatenate([self._positions(p).reshape(-1) for p in self.parts])[None]
        self.last = np.concatenate([a + np.arange(1, p.idx.shape[0] + 1) * p.idx.shape[1] - 1
                                    for a, p in zip(self.bounds, self.parts)])
        # Which keys each part's queries may see: padding hidden, or past the context (a
        # sliding window); None where the engine's own causal rule is that (no padding).
        self.masks: list[Any] = []
        for p in self.parts:
            T, past = p.idx.shape[1], p.cache.query_offset(p.idx.shape[1])
            needed = p.key_mask is not None or past + T > block_size
            self.masks.append(allowed_keys(T, past, p.key_mask, block_size) if needed else None)

    @staticmethod
    def _positions(p: Part) -> np.ndarray:
        if p.pos_ids is not None:
            return np.asarray(p.pos_ids, dtype=np.int64)
        B, T = p.idx.shape
        return np.broadcast_to(p.cache.length + np.arange(T, dtype=np.int64), (B, T))

    @property
    def tokens(self) -> int:
        return int(self.bounds[-1])

    def convert_masks(self, convert: Callable[[np.ndarray], Any]) -> None:
        """Each boolean mask in the engine's own form (an additive array, a tensor), once a
        pass rather than once a layer."""
        self.masks = [None if m is None else convert(m) for m in self.masks]

    def make_room(self) -> None:
        """Each part's cache grown now for its tokens (sheepop.arch.kv_cache.KVCache.make_room)."""
        for p in self.parts:
            p.cache.make_room(p.idx.shape[1])

    def rows(self, i: int, t: Any) -> Any:
        """Part i's share of t (1, H, N, d) as (B_i, H, T_i, d)."""
        B, T = self.parts[i].idx.shape
        own = t[0, :, self.bounds[i]:self.bounds[i + 1]]
        return own.reshape(own.shape[0], B, T, own.shape[-1]).swapaxes(0, 1)

    @staticmethod
    def flat(y: Any) -> Any:
        """(B, H, T, d) -> (H, B T, d): a part's rows back end to end (`rows`' inverse)."""
        B, H, T, d = y.shape
        return y.swapaxes(0, 1).reshape(H, B * T, d)

    def attend(self, layer: int, q: Any, k: Any, v: Any, attend: Attend,
               concatenate: Callable) -> Any:
        """Y (1, H, N, d_k) for the packed queries q (1, H, N, d_k), keys and values (1, H_kv,
        N, d_k): each part's keys and values stored in its own cache at `layer`, its queries
        attending over that cache with `attend`, under its own mask."""
        ys = []
        for i, p in enumerate(self.parts):
            T = p.idx.shape[1]
            past = p.cache.query_offset(T)
            keys, values = p.cache.update(layer, self.rows(i, k), self.rows(i, v))
            ys.append(self.flat(attend(self.rows(i, q), keys, values, self.masks[i], past)))
        return concatenate(ys, 1)[None]

    def advance(self, tokens: int) -> None:
        """Every part's cache has taken its tokens (at the end of the pass: the N `tokens`)."""
        assert tokens == self.tokens, f"{tokens} tokens advanced, {self.tokens} packed"
        for p in self.parts:
            p.cache.advance(p.idx.shape[1])

    def per_token(self, rows: np.ndarray) -> np.ndarray:
        """An array of one value per row, (R, 1, ...), as one per token, (1, N, ...): each row's
        at each of its tokens; one value for every row, (1, 1, ...), as it is."""
        if rows.shape[0] == 1 and len(self.last) != 1:
            return rows
        tokens = np.concatenate([np.full(p.idx.shape[0], p.idx.shape[1]) for p in self.parts])
        return np.repeat(rows[:, 0], tokens, axis=0)[None]

    def split(self, logits: Any) -> list[Any]:
        """The logits (R, V) after each row's last token, as one (B_i, V) per part."""
        rows = np.cumsum([0] + [p.idx.shape[0] for p in self.parts])
        return [logits[a:b] for a, b in zip(rows[:-1], rows[1:])]

"""One prompt's prefill, a chunk at a time, from its longest cached prefix.

A server's running batch decodes one token per stream per step; a prompt that joins it must
first be prefilled, and a long one (SmolLM2, 3,782 tokens: ~35 s on 2 cores) would stop every
stream for all of it if done at once. `Prefill` holds the prompt's keys and values in a
single-row cache of its own, and `advance(n)` computes the next n of its tokens, continuing
that cache: the scheduler (sheepop.serve.api.scheduler) interleaves these chunks with the
batch's decode steps, and the prompt joins the batch (`RunningBatch.place`) once its last
token's logits are known.

Chunks change no number that matters: with a cache, a pass over tokens s .. e-1 sees exactly
the keys of tokens 0 .. e-1 at their own positions (attention is causal), so the keys, values
and last logits are those of one pass over the whole prompt, up to float rounding (a pass of
another size sums in another order); whole prompts are themselves computed CHUNK_ROWS
positions a pass (sheepop.generation.cached_lm).

A prefix cache (sheepop.generation.prefix_cache) may supply the first tokens' keys and values
(`cached`); the prompt's whole blocks are stored back in it when it is done.

Short prompts that arrive together cost less in one pass than in one pass each (a pass reads
every weight once): `prefill_together` computes several fresh prefills (nothing cached) as one
left-padded batch (sheepop.arch.batch: each row at its own positions, its padding masked), then
gives each its own row.

A steered prompt (a request's steering, sheepop.generation.steering) is computed under its
own steering, alone or as its row of a pass together, and neither reads nor fills the prefix
cache: its keys and values are the steered model's.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sheepop.arch.batch import left_pad
from sheepop.arch.kv_cache import GROWTH_CHUNK
from sheepop.arch.packed import Part
from sheepop.generation.cached_lm import CachedLM
from sheepop.generation.prefix_cache import PrefixCache
from sheepop.generation.steering import Steering


class Prefill:
    """The prefill of `prompt` in progress: `done` of its tokens are in `cache` (the first
    `cached` of them copied from `prefix`); `logits` (V,) after its last token once finished."""

    def __init__(self, lm: CachedLM, prompt: Sequence[int], prefix: PrefixCache | None = None,
                 steering: Steering | None = None):
        if len(prompt) == 0:
            raise ValueError("a prompt needs at least one token")
        if steering is not None:  # its keys and values are the steered model's: not shared
            prefix = None
        self.lm, self.prompt, self.prefix, self.steering = lm, list(prompt), prefix, steering
        # The whole prompt's columns at once, and a few more: it grows by no copy as its
        # chunks come, and a running batch may take it as it is (RunningBatch.place). Not
        # zeroed: its chunks (or the prefix cache) write every one before it is read, and the
        # zeros of a long prompt's columns stalled every running stream (kv_cache's docstring).
        self.cache = lm._new_cache(1)
        self.cache.reserve(min(len(self.prompt) + GROWTH_CHUNK, self.cache.max_len),
                           unwritten=len(self.prompt))
        self.cached = prefix.fill(self.prompt, self.cache) if prefix is not None else 0
        self.done = self.cached
        self.logits: np.ndarray | None = None

    @property
    def left(self) -> int:
        """Tokens still to compute."""
        return len(self.prompt) - self.done

    @property
    def finished(self) -> bool:
        return self.left == 0

    def advance(self, tokens: int) -> int:
        """Compute the next `tokens` tokens (at most what is left) in a pass of their own; the
        number computed. The last chunk sets `logits` and stores the prompt's blocks in the
        prefix cache."""
        part = self.part(tokens)
        with self.lm.steered_rows([self.steering]):
            logits = self.lm._prefill(part.idx, self.cache)
        return self.advanced(part, logits[0])

    def part(self, tokens: int) -> Part:
        """The next `tokens` tokens (at most what is left) as a part of a mixed pass
        (sheepop.arch.packed, `CachedLM.mixed`); `advanced` once it has run."""
        end = min(len(self.prompt), self.done + max(1, tokens))
        return Part(np.asarray(self.prompt[self.done:end], dtype=np.int64)[None, :], self.cache)

    def advanced(self, part: Part, logits: np.ndarray) -> int:
        """Count `part`'s tokens as computed, `logits` (V,) after its last; the number."""
        count = part.idx.shape[1]
        self.done += count
        if self.finished:
            self._finish(logits)
        return count

    def _finish(self, logits: np.ndarray) -> None:
        self.logits = logits
        if self.prefix is not None:
            self.prefix.store(self.prompt, self.cache.k[:, 0], self.cache.v[:, 0],
                              self.cache.digit_run)


def prefill_together(prefills: Sequence[Prefill]) -> None:
    """Finish these prefills, none of which has a token yet, in one left-padded pass; each then
    holds its prompt in its own cache, as if computed alone (up to rounding)."""
    if any(p.done for p in prefills):
        raise ValueError("prefill_together takes prefills that have not started")
    lm = prefills[0].lm
    idx, pos, real = left_pad([p.prompt for p in prefills])
    L = idx.shape[1]
    batch = lm._new_cache(len(prefills), L)
    with lm.steered_rows([p.steering for p in prefills]):
        logits = lm._prefill(idx, batch, **({} if real.all() else {"pos_ids": pos,
                                                                    "key_mask": real}))
    for i, p in enumerate(prefills):
        n = len(p.prompt)  # (row i holds it right-aligned: columns L - n .. L - 1)
        p.cache.reserve(n)
        p.cache.k[:, 0, :, :n] = batch.k[:, i, :, L - n:L]
        p.cache.v[:, 0, :, :n] = batch.v[:, i, :, L - n:L]
        if batch.digit_run is not None:
            p.cache.digit_run = batch.digit_run[i:i + 1]
        p.cache.length = p.done = n
        p._finish(logits[i])

"""What the generation loops (sheepop.generation.generate) ask of a model: the next-token logits
of the last position as NumPy, with or without its KV cache, for one sequence
(`LanguageModel`) or several left-padded ones at once (`BatchLanguageModel`).
`sheepop.generation.cached_lm.CachedLM` implements both for either engine."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np


class LanguageModel(Protocol):
    block_size: int
    never_generate: Sequence[int]  # ids never drawn (optional: a model without it has none)
    slides: bool  # a full cache rolls on past the context (optional: False without it)

    def prefill(self, ids: Sequence[int]) -> np.ndarray:
        """Start a fresh cache holding `ids`; return the logits (V,) after the last of them."""

    def decode(self, token: int) -> np.ndarray:
        """Append one token to the cache; return the logits (V,) after it."""

    def full(self, ids: Sequence[int]) -> np.ndarray:
        """Logits (V,) after the last of `ids`, recomputed without a cache."""

    @property
    def cache_length(self) -> int: ...


class ProposalChecker(Protocol):
    """What one pass of speculative decoding asks of a cache (sheepop.generation.speculative.
    check_pass): to check several tokens in one pass and forget the rejected ones. A
    `CachedLM` is one, and so is a running batch while a single sequence runs
    (sheepop.generation.running_batch)."""

    def decode(self, token: int) -> np.ndarray:
        """Append one token to the cache; return the logits (V,) after it."""

    def room(self) -> int:
        """How many more tokens `verify` may append (0: none; it cannot roll back)."""

    def verify(self, ids: Sequence[int]) -> np.ndarray:
        """Append `ids` to the cache in one pass; the logits (len(ids), V) after each."""

    def rollback(self, n: int) -> None:
        """Forget the last n tokens of the cache."""


class CheckingLanguageModel(LanguageModel, ProposalChecker, Protocol):
    """A `LanguageModel` that checks several tokens in one pass and forgets the rejected ones
    (speculative decoding, sheepop.generation.speculative)."""


class BatchLanguageModel(Protocol):
    block_size: int
    never_generate: Sequence[int]
    slides: bool

    def prefill_batch(self, rows: Sequence[Sequence[int]]) -> np.ndarray:
        """Start a fresh batch cache holding `rows` (left-padded); logits (B, V) after each."""

    def decode_batch(self, tokens: Sequence[int]) -> np.ndarray:
        """Append one token to each row; logits (B, V) after them."""

    def full_batch(self, rows: Sequence[Sequence[int]]) -> np.ndarray:
        """Logits (B, V) after each row's last token, recomputed without a cache."""

    def keep_rows(self, rows: Sequence[int]) -> None:
        """Drop every row of the batch cache but these (in this order)."""

    @property
    def batch_length(self) -> int:
        """Cache columns in use (the longest row, padding included)."""


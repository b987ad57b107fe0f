"""The generation loop shared by both engines: prompt -> tokens, one at a time, streamed.

An engine takes part through a `LanguageModel` adapter that returns the next-token logits of the
last position as NumPy, with or without its KV cache. The loop keeps the context to the last
`block_size` tokens: a longer prompt is cropped, and once generation runs past the context the
window slides (the cache is refilled from the last `block_size` tokens, so cached and uncached
generation compute exactly the same logits).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from sheepop.config import SampleConfig
from sheepop.sample import draw, probabilities, softmax, top_tokens


class LanguageModel(Protocol):
    block_size: int

    def prefill(self, ids: Sequence[int]) -> np.ndarray:
        """Start a fresh cache holding `ids`; return the logits (V,) after the last of them."""

    def decode(self, token: int) -> np.ndarray:
        """Append one token to the cache; return the logits (V,) after it."""

    def full(self, ids: Sequence[int]) -> np.ndarray:
        """Logits (V,) after the last of `ids`, recomputed without a cache."""

    @property
    def cache_length(self) -> int: ...


@dataclass
class Step:
    token: int
    top: list[tuple[int, float]]  # the K most likely next tokens (only with show_probs)


def generate(lm: LanguageModel, prompt: Sequence[int], cfg: SampleConfig,
             use_cache: bool = True, eos_id: int | None = None, show_probs: int = 0
             ) -> Iterator[Step]:
    """Yield up to `cfg.max_new_tokens` tokens after `prompt`, stopping after `eos_id`."""
    if len(prompt) == 0:
        raise ValueError("generation needs at least one prompt token")
    T = lm.block_size
    ids = list(prompt)
    rng = np.random.default_rng(cfg.seed)
    logits = lm.prefill(ids[-T:]) if use_cache else lm.full(ids[-T:])
    for _ in range(cfg.max_new_tokens):
        probs = probabilities(logits, cfg.temperature, cfg.top_k, cfg.top_p)
        token = int(np.argmax(logits)) if cfg.temperature <= 0 else draw(probs, rng)
        shown = probs if cfg.temperature > 0 else softmax(logits)
        yield Step(token, top_tokens(shown, show_probs) if show_probs else [])
        if eos_id is not None and token == eos_id:
            return
        ids.append(token)
        if not use_cache:
            logits = lm.full(ids[-T:])
        elif lm.cache_length < T:
            logits = lm.decode(token)
        else:  # the context is full: slide the window by refilling the cache
            logits = lm.prefill(ids[-T:])

"""How fast a generation went, in the figures llama.cpp and `ollama run --verbose` print: the
prompt's tokens per second, the time to first token, and the generated tokens per second.

    time to first token  t1 = the first token's time - the start (the prompt's forward pass
                         and the first draw; in a server, the wait in the queue too)
    prompt tokens/s      = P / t1, P the prompt tokens the model read
    generated tokens/s   = (N - 1) / (tN - t1), the N - 1 tokens after the first, each one
                         decode step (llama.cpp's "eval time ... runs")

`Speed.line()` says all of them with the counts and times they come from, so each rate is
the quotient of two figures on the same line; `Stopwatch` measures them around a stream of
tokens (sheepop.generation.generate's steps). Used by `generate`, `chat` and `serve`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from sheepop.words import plural

T = TypeVar("T")


@dataclass
class Speed:
    prompt_tokens: int
    generated: int                # N, the tokens generated (an end token included)
    first_s: float | None         # t1 (None: no token was generated)
    rest_s: float                 # tN - t1, the time of the N - 1 tokens after the first

    def line(self) -> str:
        """E.g. 'prompt 9 tokens, 401.6 tokens/s (time to first token 22.41 ms); generated
        200 tokens, 94.7 tokens/s (the 199 after the first in 2101.34 ms)'."""
        prompt = f"prompt {plural(self.prompt_tokens, 'token')}"
        if self.first_s is None:
            return f"{prompt}; no token generated"
        head = (f"{prompt}, {rate(self.prompt_tokens, self.first_s)} (time to first token "
                f"{1000 * self.first_s:.2f} ms)")
        if self.generated < 2:
            return f"{head}; generated 1 token"
        after = self.generated - 1
        return (f"{head}; generated {plural(self.generated, 'token')}, "
                f"{rate(after, self.rest_s)} (the {after:,} after the first in "
                f"{1000 * self.rest_s:.2f} ms)")


def rate(count: int, seconds: float) -> str:
    """count / seconds as 'X tokens/s' (a time the clock could not tell from 0: 'inf')."""
    return f"{count / seconds:.1f} tokens/s" if seconds > 0 else "inf tokens/s"


class Stopwatch:
    """The times of a stream of tokens: `watch(steps)` passes each step on and notes when it
    came; `speed()` once the stream has ended (or been left)."""

    def __init__(self, prompt_tokens: int):
        self.prompt_tokens = prompt_tokens
        self.start = time.perf_counter()
        self.first: float | None = None
        self.last: float | None = None
        self.count = 0

    def watch(self, steps: Iterable[T]) -> Iterator[T]:
        for step in steps:
            self.tick()
            yield step

    def tick(self, now: float | None = None) -> None:
        """A token was drawn `now` (time.perf_counter's; None: just now)."""
        now = time.perf_counter() if now is None else now
        if self.first is None:
            self.first = now
        self.last = now
        self.count += 1

    def speed(self) -> Speed:
        if self.first is None or self.last is None:
            return Speed(self.prompt_tokens, 0, None, 0.0)
        return Speed(self.prompt_tokens, self.count, self.first - self.start,
                     self.last - self.first)

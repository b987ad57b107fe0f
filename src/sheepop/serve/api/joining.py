"""The choices admitted to the batch whose prompts are still being prefilled, a chunk at a time.

Each prompt (the copies of one prompt, `n` > 1, share it) has a `Prefill`
(sheepop.generation.prefill): its cache starts from the longest prefix the server's
`PrefixCache` holds, and every scheduler iteration spends at most `chunk` prompt tokens of
computation, first come first served, before the running batch's decode step. So a decode step
never waits for more than one chunk of anyone's prompt, and a prompt of p uncached tokens joins
after ceil(p / chunk) iterations. Their rows are reserved from admission on (`rows`), so a
prompt never finishes without a row to go to.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from sheepop.generation.cached_lm import CachedLM
from sheepop.generation.prefill import Prefill
from sheepop.generation.prefix_cache import PrefixCache
from sheepop.serve.api.choice import Choice


def copies_together(admitted: list[Choice]) -> list[list[Choice]]:
    """The admitted choices in groups of the copies of one prompt (n > 1), in order."""
    groups: list[list[Choice]] = []
    for c in admitted:
        if groups and groups[-1][0].job is c.job and groups[-1][0].prompt_index == c.prompt_index:
            groups[-1].append(c)
        else:
            groups.append([c])
    return groups


class Joining:
    """Prompts being prefilled, in order of admission, and the choices waiting on each."""

    def __init__(self, lm: CachedLM, prefix: PrefixCache, chunk: int):
        self.lm, self.prefix, self.chunk = lm, prefix, chunk
        self.groups: list[tuple[list[Choice], Prefill]] = []

    @property
    def rows(self) -> int:
        """The batch rows these choices will take."""
        return sum(len(copies) for copies, _ in self.groups)

    def __bool__(self) -> bool:
        return bool(self.groups)

    def add(self, admitted: list[Choice]) -> None:
        """Start each admitted prompt's prefill from its cached prefix (one per prompt)."""
        for copies in copies_together(admitted):
            prefill = Prefill(self.lm, copies[0].prompt, self.prefix)
            copies[0].job.cached_tokens += prefill.cached
            self.groups.append((copies, prefill))

    def advance(self) -> Iterator[tuple[list[Choice], Prefill]]:
        """Spend this iteration's `chunk` tokens on the prompts in order; yield each prompt
        that is done (its choices and its prefill), as soon as it is."""
        budget = self.chunk
        while self.groups and budget > 0:
            copies, prefill = self.groups[0]
            budget -= prefill.advance(budget)
            copies[0].job.prefill_chunks += 1
            if not prefill.finished:
                return
            self.groups.pop(0)
            yield copies, prefill

    def drop(self, gone: Callable[[Choice], bool]) -> None:
        """Forget the choices `gone` says must stop, and any prompt left with none."""
        groups = [([c for c in copies if not gone(c)], p) for copies, p in self.groups]
        self.groups = [(copies, p) for copies, p in groups if copies]

    def clear(self) -> list[Choice]:
        """Forget them all; the choices that were waiting."""
        out = [c for copies, _ in self.groups for c in copies]
        self.groups = []
        return out

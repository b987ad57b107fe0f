"""The choices admitted to the batch whose prompts are still being prefilled, a chunk at a time.

Each prompt (the copies of one prompt, `n` > 1, share it) has a `Prefill`
(sheepop.generation.prefill): its cache starts from the longest prefix the server's
`PrefixCache` holds, and every scheduler iteration spends at most a chunk of prompt tokens of
computation, first come first served, before the running batch's decode step. So a decode step
never waits for more than one chunk of anyone's prompt, and a prompt of p uncached tokens joins
after ceil(p / chunk) iterations. Their rows are reserved from admission on (`rows`), so a
prompt never finishes without a row to go to.

The chunk (`budget`): none while no sequence is running (nobody to stall: whole prompts, in
order); else `chunk` tokens when set, or by default (0) as many as take the time of one decode
step, max(t_step, MIN_STALL_S) / t_token, from the measured decode steps and prefill passes
(exponential moving averages), at least MIN_CHUNK: a running stream's gap is then about two
steps, or a step and MIN_STALL_S where steps are quicker than that (a small model's: a burst of
short prompts then joins in a few iterations, not one chunk of a millisecond's worth at a time),
whatever the model, the batch and the machine.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from sheepop.generation.cached_lm import CachedLM
from sheepop.generation.prefill import Prefill, prefill_together
from sheepop.generation.prefix_cache import PrefixCache
from sheepop.serve.api.choice import Choice

MIN_CHUNK = 16  # tokens: below it a pass costs about what a one-token pass does (the weights)
FIRST_CHUNK = 32  # until a step and a pass have been measured
MIN_STALL_S = 0.1  # seconds of prompt an iteration may always compute (see above)
WHOLE = 1 << 40  # "no bound": a budget no prompt reaches
SMOOTHING = 0.3  # the weight of the newest measurement in the moving averages
TOGETHER = 2048  # the most padded tokens of fresh prompts prefilled in one pass
WASTE = 0.25  # ... with padding at most this share of their own tokens


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

    def __init__(self, lm: CachedLM, prefix: PrefixCache, chunk: int = 0):
        self.lm, self.prefix, self.chunk = lm, prefix, chunk
        self.groups: list[tuple[list[Choice], Prefill]] = []
        self.step_s = self.token_s = np.nan  # moving averages: a decode step, a prompt token
        self.spent = 0  # tokens computed by the last `advance`

    def budget(self, running: bool) -> int:
        """The prompt tokens this iteration may compute (see the module's docstring)."""
        if not running:
            return WHOLE
        if self.chunk:
            return self.chunk
        if np.isnan(self.step_s) or np.isnan(self.token_s):
            return FIRST_CHUNK
        return max(MIN_CHUNK, int(max(self.step_s, MIN_STALL_S) / self.token_s))

    def measured(self, step_s: float | None = None, prefill_s: float | None = None) -> None:
        """Fold in a decode step's time, or the last `advance`'s (over its `spent` tokens)."""
        def mean(old: float, new: float) -> float:
            return new if np.isnan(old) else (1 - SMOOTHING) * old + SMOOTHING * new
        if step_s is not None:
            self.step_s = mean(self.step_s, step_s)
        if prefill_s is not None and self.spent:
            self.token_s = mean(self.token_s, prefill_s / self.spent)

    @property
    def rows(self) -> int:
        """The batch rows these choices will take."""
        return sum(len(copies) for copies, _ in self.groups)

    def __bool__(self) -> bool:
        return bool(self.groups)

    def add(self, admitted: list[Choice]) -> None:
        """Start each admitted prompt's prefill from its cached prefix (one per prompt)."""
        for copies in copies_together(admitted):
            prefill = Prefill(self.lm, copies[0].prompt, self.prefix,
                              copies[0].job.request.steering)
            copies[0].job.cached_tokens += prefill.cached
            self.groups.append((copies, prefill))

    def advance(self, budget: int) -> Iterator[tuple[list[Choice], Prefill]]:
        """Spend `budget` tokens on the prompts in order; yield each prompt that is done (its
        choices and its prefill), as soon as it is."""
        self.spent = 0
        while self.groups and budget > self.spent:
            together = self._fresh_run(budget - self.spent)
            if len(together) > 1:  # short new prompts: one left-padded pass for them all
                prefill_together([p for _, p in together])
                self.spent += sum(len(p.prompt) for _, p in together)
            else:
                copies, prefill = together[0] if together else self.groups[0]
                self.spent += prefill.advance(budget - self.spent)
                together = [(copies, prefill)] if prefill.finished else []
                copies[0].job.prefill_chunks += 1
            for copies, prefill in together:
                if len(together) > 1:
                    copies[0].job.prefill_chunks += 1
                self.groups.pop(0)
                yield copies, prefill
            if not together:
                return

    def _fresh_run(self, budget: int) -> list[tuple[list[Choice], Prefill]]:
        """The first prompts, in order, that have nothing cached or computed and fit in one
        left-padded pass within `budget` (and TOGETHER) padded tokens, wasting at most WASTE
        of their own on padding."""
        run, longest, total = [], 0, 0
        for copies, prefill in self.groups:
            n = len(prefill.prompt)
            if prefill.done:
                break
            padded = max(longest, n) * (len(run) + 1)
            if padded > min(budget, TOGETHER) or padded > (1 + WASTE) * (total + n):
                break
            run.append((copies, prefill))
            longest, total = max(longest, n), total + n
        return run

    def drop(self, gone: Callable[[Choice], bool]) -> None:
        """Forget the choices `gone` says must stop, and any prompt left with none."""
        groups = [([c for c in copies if not gone(c)], p) for copies, p in self.groups]
        self.groups = [(copies, p) for copies, p in groups if copies]

    def clear(self) -> list[Choice]:
        """Forget them all; the choices that were waiting."""
        out = [c for copies, _ in self.groups for c in copies]
        self.groups = []
        return out

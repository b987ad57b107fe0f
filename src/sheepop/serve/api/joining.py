"""The choices admitted to the batch whose prompts are still being prefilled, a chunk at a time.

Each prompt (the copies of one prompt, `n` > 1, share it) has a `Prefill`
(sheepop.generation.prefill): its cache starts from the longest prefix the server's
`PrefixCache` holds, and every scheduler iteration spends at most a chunk of prompt tokens of
computation, first come first served. While sequences run, the chunk is computed in the same
forward pass as their decode step (`plan`, then `RunningBatch.step` with the chunks:
sheepop.arch.packed), or, where the model cannot mix them (steering, digit places, a lone
sequence speculating), in a pass of its own before the step (`advance`). So a decode step never
waits for more than one chunk of anyone's prompt, and a prompt of p uncached tokens joins after
about p / chunk iterations. Their rows are reserved from admission on (`rows`), so a prompt
never finishes without a row to go to.

The chunk (`budget`): none while no sequence is running (nobody to stall: whole prompts, in
order); else `chunk` tokens when set; else sized by cost (`size`), so that an iteration with
prompt tokens takes about

    target = max(ratio * t_step, t_step + MIN_STALL_S)      (ratio: --prefill-budget, 1.5)

t_step the median of the last STEPS iterations without prompt tokens (one slow step on a
shared machine moved a moving average by a third, and the two while a 4,000-token prompt's
request was read the median of three by 40%), at about the number of rows running now and
within the last REMEASURE iterations with prompt tokens (`current`: rows within a quarter, or
one; else the scheduler runs a plain step first: streams arriving one by one were otherwise
measured against one row's step, their prompts joining a token at a time; and once, with a
budget of 1.75 on a loaded core, a 4,000-token prompt sized against the steps before it did
not finish joining within the streams' 600 s timeout). An iteration with a chunk of C tokens
takes about t = t_step + b C, b the prompt's cost per token (it grows as a long prompt's later
tokens attend over more keys), so after each such iteration

    b_i = (t - t_step) / C,    C* = (target - t_step) / median(last RECENT b_i)

and the size moves to C*, by at most GROWTH and at least SHRINK (and grows only from a chunk it
filled: a prompt's last chunk is what was left of it). The chunk lands on the target in one
iteration; multiplying the size by target / median(t) instead, as before, approached it a
factor at a time, lagging b by a few iterations: its iterations' p99 came out 2.2x the
streams' steady one with a ratio of 1.75 on SmolLM2 (docs/serve.md, "Chunked prefill"). A
median of the b_i, not the last: the prompt's share is a small difference of two noisy times;
an iteration no slower than t_step tells nothing and is not counted; GROWTH bounds what an
underestimated b can do in one iteration. MIN_STALL_S: where steps are quicker than that
(a small model's), a burst of short prompts joins in a few iterations, not a millisecond's worth
at a time. A pass of its own has a floor of MIN_CHUNK tokens (below it the pass costs what a
one-token pass does: the weights); a mixed pass none but one token.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator

import numpy as np

from sheepop.generation.cached_lm import CHUNK_ROWS, CachedLM
from sheepop.generation.prefill import Prefill, prefill_together
from sheepop.generation.prefix_cache import PrefixCache
from sheepop.serve.api.choice import Choice

MIN_CHUNK = 16  # tokens: below it a pass costs about what a one-token pass does (the weights)
FIRST_CHUNK = 32  # the size by cost before any iteration with prompt tokens was measured
MIN_STALL_S = 0.1  # seconds of prompt an iteration may always compute (see above)
# An iteration with prompt tokens: about this many plain steps' time by default; the streams'
# p99 gap comes out about a fifth more (on SmolLM2 with 15 streams and a
# 4,000-token prompt: 1.78-1.88x their steady p99 with 1.5, 1.99-2.10x with 1.75;
# docs/serve.md, "Chunked prefill").
RATIO = 1.5
GROWTH, SHRINK = 1.25, 0.5  # the most the size grows or shrinks by after one iteration
WHOLE = 1 << 40  # "no bound": a budget no prompt reaches
STEPS, RECENT = 5, 3  # the plain steps t_step is the median of; the iterations sizing a chunk
REMEASURE = 8  # iterations with prompt tokens at most between two plain steps
MIXED_MOST = CHUNK_ROWS  # prompt tokens in one mixed pass at most (its attention's memory)
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

    def __init__(self, lm: CachedLM, prefix: PrefixCache, chunk: int = 0,
                 ratio: float = RATIO):
        self.lm, self.prefix, self.chunk, self.ratio = lm, prefix, chunk, ratio
        self.groups: list[tuple[list[Choice], Prefill]] = []
        self.steps: deque[float] = deque(maxlen=STEPS)  # the last plain steps' times ...
        self.step_rows = 0  # ... at about this many running rows
        self.since_step = 0  # iterations with prompt tokens since the last plain step
        self.per_token: deque[float] = deque(maxlen=RECENT)  # b: the last chunks' s/token
        self.size = float(FIRST_CHUNK)  # the chunk by cost (see the module's docstring)
        self.spent = 0  # tokens computed by the last `advance` or `plan`

    @property
    def mixable(self) -> bool:
        """Whether the chunks may go in a decode step's pass: not a fixed chunk larger than
        one pass takes (MIXED_MOST; a chunk larger than any prompt is how prompts joined
        before chunks: whole, in passes of their own)."""
        return self.chunk <= MIXED_MOST

    def budget(self, running: bool, mixed: bool = False) -> int:
        """The prompt tokens this iteration may compute (see the module's docstring); `mixed`:
        in the decode step's pass."""
        if not running:
            return WHOLE
        if self.chunk:
            return self.chunk
        return max(1 if mixed else MIN_CHUNK, int(self.size))

    def ready(self, rows: int) -> bool:
        """Whether an iteration with `rows` running may compute prompt tokens: a fixed chunk,
        or t_step `current`."""
        return bool(self.chunk) or self.current(rows)

    @property
    def step_s(self) -> float:
        """t_step: the median of the last plain steps (NaN before any)."""
        return float(np.median(self.steps)) if self.steps else np.nan

    def current(self, rows: int) -> bool:
        """Whether t_step was measured at about `rows` running rows (within a quarter, or
        one), within the last REMEASURE iterations with prompt tokens."""
        return (bool(self.steps) and self.since_step < REMEASURE
                and abs(rows - self.step_rows) <= max(1, self.step_rows // 4))

    def measured(self, step_s: float | None = None, iteration_s: float | None = None,
                 rows: int = 0) -> None:
        """Fold in a decode step's time at `rows` running rows (a step at another number
        starts t_step again), or the time of the last iteration that computed `spent` prompt
        tokens (see the module's docstring)."""
        if step_s is not None:
            if not (self.steps and abs(rows - self.step_rows) <= max(1, self.step_rows // 4)):
                self.steps.clear()
            self.steps.append(step_s)
            self.step_rows, self.since_step = rows, 0
        if iteration_s is None or not self.spent or not self.steps:
            return
        self.since_step += 1
        step = self.step_s
        if iteration_s > step:  # (a chunk's share lost in the step's noise tells nothing)
            self.per_token.append((iteration_s - step) / self.spent)
        if not self.per_token:
            return
        target = max(self.ratio * step, step + MIN_STALL_S)
        wanted = (target - step) / float(np.median(self.per_token))
        factor = min(GROWTH, max(SHRINK, wanted / self.size))
        if factor < 1 or self.spent >= int(self.size):
            self.size = max(1.0, self.size * factor)

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

    def plan(self, budget: int) -> list[tuple[Prefill, int]]:
        """This iteration's chunks for a mixed pass (`RunningBatch.step`): `budget` tokens
        (MIXED_MOST at most) shared by the prompts in order, (prefill, tokens) for each that
        gets some; `joined` once the pass has run."""
        plan, left = [], min(budget, MIXED_MOST)
        for copies, prefill in self.groups:
            if left <= 0:
                break
            n = min(left, prefill.left)
            plan.append((prefill, n))
            copies[0].job.prefill_chunks += 1
            left -= n
        self.spent = sum(n for _, n in plan)
        return plan

    def joined(self) -> list[tuple[list[Choice], Prefill]]:
        """The prompts finished by the last mixed pass, in order (their choices, their
        prefill), no longer joining."""
        done = [(copies, p) for copies, p in self.groups if p.finished]
        self.groups = [(copies, p) for copies, p in self.groups if not p.finished]
        return done

    def advance(self, budget: int) -> Iterator[tuple[list[Choice], Prefill]]:
        """Spend `budget` tokens on the prompts in order, in passes of their own; yield each
        prompt that is done (its choices and its prefill), as soon as it is."""
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

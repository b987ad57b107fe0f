"""A running batch in lanes: sequences of very different lengths decode together without
sharing columns (docs/serve.md, "Chunked prefill").

A `RunningBatch` keeps its rows in shared columns: every row has as many as the longest running
row, a shorter one's first ones masked as padding. When a 4,000-token prompt joins 15 streams
of a hundred tokens, every row takes 4,000 columns: the store is reallocated for all of them at
the join (SmolLM2, 16 rows: 3 GB, 5.0 s on one loaded core) and every decode step then reads
them all (2.6 s a step against 0.52 s before). `Lanes` keeps several running batches, the
lanes, each with its own store and columns, and runs their decode steps in one forward pass
(`step_together`: one part per lane in `CachedLM.mixed`, each attending over its own columns),
so a long sequence costs the others only its own row's attention.

Which lane (`place`): where a new sequence of L tokens (n copies) adds the fewest columns that
a step reads: joining lane l adds (rows_l + n) max(length_l, L) - rows_l length_l of them, a
lane of its own n L + LANE_COST, the price of a part's own attention calls counted in columns.
A lane of its own takes the prompt's cache as its store, without a copy (`RunningBatch.place`:
the 4,000-token join took 0.47 s copying, 0.2 ms taking). A model that cannot mix sequences in
one pass (`CachedLM.mixes`: digit places) keeps one lane.

Rows are numbered lane by lane, in the order the lanes opened: `place` says where the new rows
went, `leave` gives the new order, as a RunningBatch's does. Speculation (`room`, `verify`,
`rollback`, `decode`) needs a single running row, so a single lane.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from sheepop.generation.cached_lm import CachedLM
from sheepop.generation.prefill import Prefill
from sheepop.generation.running_batch import RunningBatch, step_together

# A lane's own part in a pass costs its attention's calls in every layer, about what reading
# this many more columns costs (SmolLM2 on one core: ~2 ms a part, a column ~9 us).
LANE_COST = 256


class Lanes:
    """Up to `capacity` sequences decoding together in lanes of their own columns; they join
    (`place`) and leave (`leave`) between any two steps (`step`)."""

    def __init__(self, lm: CachedLM, capacity: int):
        if capacity < 1:
            raise ValueError(f"a running batch needs at least one row, not {capacity}")
        self.lm, self.capacity = lm, capacity
        self.lanes: list[RunningBatch] = []
        self.peak_bytes = 0  # the most held so far: each lane's peak, summed (an upper bound)

    @property
    def rows(self) -> int:
        return sum(lane.rows for lane in self.lanes)

    @property
    def free(self) -> int:
        return self.capacity - self.rows

    def _first_row(self, lane: RunningBatch) -> int:
        return sum(other.rows for other in self.lanes[:self.lanes.index(lane)])

    def _locate(self, row: int) -> tuple[RunningBatch, int]:
        """The lane of running row `row`, and its row there."""
        for lane in self.lanes:
            if 0 <= row < lane.rows:
                return lane, row
            row -= lane.rows
        raise ValueError(f"row {row} is not running")

    def place(self, prefill: Prefill, copies: int = 1) -> int:
        """Add a finished `Prefill` as `copies` rows of the lane that costs least (see the
        module's docstring); the number of the first of them (the others follow it)."""
        if copies > self.free:
            raise ValueError(f"{copies} rows asked, {self.free} free")
        n, length = copies, len(prefill.prompt)
        best, cost = None, n * length + LANE_COST
        for lane in self.lanes:
            added = (lane.rows + n) * max(lane.length, length) - lane.rows * lane.length
            if added < cost or not self.lm.mixes:
                best, cost = lane, added
        if best is None:
            best = RunningBatch(self.lm, self.capacity)
            self.lanes.append(best)
        first = self._first_row(best) + best.rows
        best.place(prefill, copies)
        self._track()
        return first

    def step(self, tokens: Sequence[int], chunks: Sequence[tuple[Prefill, int]] = ()
             ) -> np.ndarray:
        """Append token b to running row b; the logits (rows, V) after them; `chunks` as
        `RunningBatch.step`'s, in the same pass."""
        if len(self.lanes) == 1:
            logits = self.lanes[0].step(tokens, chunks)
        else:
            logits = step_together(self.lanes, tokens, chunks)
        self._track()
        return logits

    def leave(self, rows: Sequence[int]) -> list[int]:
        """Drop these rows (a lane left empty closes); the new order: row i is the old row
        order[i]."""
        gone = set(rows)
        if not gone <= set(range(self.rows)):
            raise ValueError(f"rows {sorted(gone)} are not all running (0..{self.rows - 1})")
        order, first = [], 0
        for lane in self.lanes:
            n = lane.rows
            kept = lane.leave([r - first for r in gone if first <= r < first + n])
            order += [first + r for r in kept]
            first += n
        self.lanes = [lane for lane in self.lanes if lane.rows]
        return order

    def row_keys(self, row: int) -> tuple[Any, Any]:
        """Row `row`'s keys and values (n_layer, H_kv, span, d_k), from its first token."""
        lane, r = self._locate(row)
        return lane.row_keys(r)

    # ----- speculative decoding while one sequence runs: a ProposalChecker -------------------
    def room(self) -> int:
        """(RunningBatch.room) 0 unless a single sequence runs."""
        return self.lanes[0].room() if self.rows == 1 else 0

    def verify(self, ids: Sequence[int]) -> np.ndarray:
        return self._lone().verify(ids)

    def rollback(self, n: int) -> None:
        self._lone().rollback(n)

    def decode(self, token: int) -> np.ndarray:
        return self._lone().decode(token)

    def _lone(self) -> RunningBatch:
        if self.rows != 1:
            raise ValueError(f"speculation needs one running row, not {self.rows}")
        return self.lanes[0]

    # ----- memory ----------------------------------------------------------------------------
    @property
    def nbytes(self) -> int:
        """The bytes of keys and values the lanes hold now."""
        return sum(lane.nbytes for lane in self.lanes)

    def _track(self) -> None:
        self.peak_bytes = max(self.peak_bytes, sum(lane.peak_bytes for lane in self.lanes))

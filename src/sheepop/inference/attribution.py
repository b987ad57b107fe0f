"""Attribution patching (docs/experiments.md): the first-order estimate of activation
patching's grid (sheepop.inference.patching) from two forward passes and one backward pass,
where the exact grid takes one forward pass a cell.

Moving a point's value a from the corrupted pass (a*) to the clean one's (a) changes the
metric m = z[answer] - z[wrong] by, to first order in the difference,

    m_patched - m_corrupted ~ (a - a*) . dm/da |_(corrupted pass)

the dot product over the cell's part of the point (a block's output at one position; one
head's output at every position, or at one), the gradient taken once on the corrupted pass:
the torch engine's by autograd through the hooked points, the NumPy engine's by its
hand-written backward read at the same points (sheepop.scratch.gpt.gpt_backward). The grid's
score is the estimate over m_clean - m_corrupted, as the exact grid's. Where the metric is
close to linear in the point between the two values the two grids agree; where a later
non-linearity (a softmax saturating, a norm) bends it they part, which is what the comparison
shows (docs/experiments.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sheepop.inference.hooked_engines import HookedEngine
from sheepop.inference.patching import (
    Contrast,
    PatchGrid,
    check_apart,
    grid_axes,
    index_of,
    point_of,
)


def attribution_grid(engine: HookedEngine, c: Contrast, kind: str,
                     layers: Sequence[int] | None = None, position: int | None = None
                     ) -> PatchGrid:
    """The estimated grid of `patch_grid(engine, c, kind, layers, position)`: each cell's
    metric is m_corrupted + (a - a*) . dm/da over the cell's part of its point."""
    rows, columns = grid_axes(engine, kind, c, layers, position)
    points = [point_of(kind, layer) for layer in rows]
    z_clean, clean = engine.values(c.clean, points)
    z_corrupted, corrupted, grads = engine.gradients(c.corrupted, points,
                                                     {c.answer: 1.0, c.wrong: -1.0})
    m_clean, m_corrupted = c.metric(z_clean), c.metric(z_corrupted)
    check_apart(m_clean, m_corrupted)
    metric = np.empty((len(rows), len(columns)))
    for r, point in enumerate(points):
        change = clean[point].astype(np.float64) - corrupted[point]
        grad = grads[point].astype(np.float64)
        for j, column in enumerate(columns):
            where = index_of(kind, column, position)
            metric[r, j] = m_corrupted + float(np.sum(change[where] * grad[where]))
    return PatchGrid(kind, rows, columns, metric, m_clean, m_corrupted,
                     position if kind == "heads" else None)

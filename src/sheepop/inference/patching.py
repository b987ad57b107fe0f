"""Activation patching (docs/experiments.md): which values of a model carry what tells two
prompts apart, found by moving one value from one prompt's pass into the other's.

A clean prompt and a corrupted one of the same length (the same positions, a few tokens
changed), an answer token and a wrong one. The metric of a pass, on the logits z at the last
position:

    m = z[answer] - z[wrong]

m_clean and m_corrupted are the two plain passes'. A point is one value of the pass (a block's
residual stream at one position, one head's output at one position or at all of them): the
corrupted prompt's pass with that value replaced by the clean pass's (a hook that replaces the
point, sheepop.inference.hooked_engines) gives m_patched, and its score

    score = (m_patched - m_corrupted) / (m_clean - m_corrupted)

is 1 when the point carries everything that tells the prompts apart, 0 when it carries nothing
of it. Two grids:

    positions   rows: blocks l; columns: positions t; the point: h_(l+1)[t], block l's
                output (blocks.l.resid_out) at position t. The last block's row at the last
                position is the clean pass itself (the logits read that vector alone): 1.
    heads       rows: blocks l; columns: heads h; the point: o_h, head h's output
                (blocks.l.attn.heads) at every position, or at one.

Each cell is one forward pass of one prompt, the same computation as the plain passes, so a
point patched with the corrupted pass's own value gives m_corrupted to the last bit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sheepop.errors import UserError
from sheepop.inference.hooked_engines import HookedEngine, Values

KINDS = ("positions", "heads")


@dataclass(frozen=True)
class Contrast:
    """Two prompts of one length and the two answers the metric compares."""
    clean: list[int]
    corrupted: list[int]
    answer: int
    wrong: int

    def metric(self, z: np.ndarray) -> float:
        """m = z[answer] - z[wrong], in float64."""
        return float(np.float64(z[self.answer]) - np.float64(z[self.wrong]))


class ContrastError(UserError):
    """A contrast that cannot be patched; `field` names its part at fault (clean, corrupted,
    answer, wrong), for a caller that answers by field (the server's 400)."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def contrast(clean: Sequence[int], corrupted: Sequence[int], answer: int, wrong: int,
             vocab_size: int) -> Contrast:
    """The contrast, checked: a mistake is a ContrastError that names what is wrong."""
    clean, corrupted = list(clean), list(corrupted)
    if not clean:
        raise ContrastError("clean", "the clean prompt is empty")
    if len(clean) != len(corrupted):
        raise ContrastError("corrupted", f"the clean prompt has {len(clean)} tokens and the "
                            f"corrupted one {len(corrupted)}: patching moves a value to the "
                            "same position, so both must be as long")
    for name, token in (("answer", answer), ("wrong", wrong)):
        if not 0 <= token < vocab_size:
            raise ContrastError(name, f"the {name} token {token} is outside the vocabulary "
                                f"(0..{vocab_size - 1})")
    if answer == wrong:
        raise ContrastError("wrong", f"the answer and the wrong token are the same ({answer}): "
                            "the metric z[answer] - z[wrong] would be 0 on every pass")
    return Contrast(clean, corrupted, answer, wrong)


@dataclass
class PatchGrid:
    """A grid of scores: rows the blocks `layers`, columns positions or heads."""
    kind: str
    layers: list[int]
    columns: list[int]
    metric: np.ndarray       # m of each cell's pass (or its estimate), (rows, columns)
    clean: float             # m_clean
    corrupted: float         # m_corrupted
    position: int | None = None  # heads patched at this position only (None: every position)

    @property
    def scores(self) -> np.ndarray:
        """(m - m_corrupted) / (m_clean - m_corrupted)."""
        return (self.metric - self.corrupted) / (self.clean - self.corrupted)


def point_of(kind: str, layer: int) -> str:
    """The hook point a grid patches in block `layer`."""
    return f"blocks.{layer}.resid_out" if kind == "positions" else f"blocks.{layer}.attn.heads"


def index_of(kind: str, column: int, position: int | None) -> tuple:
    """The part of the point's value one cell moves: (batch, position) of the residual
    (B, T, d); (batch, head) or (batch, head, position) of the heads (B, H, T, d_k)."""
    if kind == "positions":
        return (slice(None), column)
    return (slice(None), column) if position is None else (slice(None), column, position)


def baselines(engine: HookedEngine, c: Contrast, points: Sequence[str]
              ) -> tuple[float, float, Values]:
    """(m_clean, m_corrupted, the clean pass's values at `points`)."""
    z_clean, values = engine.values(c.clean, points)
    m_corrupted = c.metric(engine.last_logits(c.corrupted, {}))
    m_clean = c.metric(z_clean)
    check_apart(m_clean, m_corrupted)
    return m_clean, m_corrupted, values


def check_apart(m_clean: float, m_corrupted: float) -> None:
    """The scores divide by m_clean - m_corrupted: equal metrics are refused."""
    if m_clean == m_corrupted:
        raise UserError(f"the clean and the corrupted prompt give the same metric "
                        f"z[answer] - z[wrong] = {m_clean:g}: there is no difference to "
                        "find the carriers of")


def grid_axes(engine: HookedEngine, kind: str, c: Contrast, layers: Sequence[int] | None,
              position: int | None) -> tuple[list[int], list[int]]:
    """(rows: the blocks asked, every one by default; columns: the positions or the heads),
    checked against the model and the prompt."""
    cfg = engine.cfg
    if kind not in KINDS:
        raise UserError(f"a patching grid is one of {', '.join(KINDS)}, not {kind!r}")
    rows = list(range(cfg.n_layer)) if layers is None else list(layers)
    bad = next((i for i in rows if not 0 <= i < cfg.n_layer), None)
    if bad is not None:
        raise UserError(f"layer {bad} is not one of this model's (0..{cfg.n_layer - 1})")
    if position is not None and not 0 <= position < len(c.clean):
        raise UserError(f"position {position} is not in the prompt (0..{len(c.clean) - 1})")
    return rows, list(range(len(c.clean) if kind == "positions" else cfg.n_head))


def patch_grid(engine: HookedEngine, c: Contrast, kind: str,
               layers: Sequence[int] | None = None, position: int | None = None) -> PatchGrid:
    """The exact grid: one corrupted pass per cell with its point moved from the clean pass.
    `layers` the rows (default every block); `position` (heads only) patches each head at
    that position alone."""
    rows, columns = grid_axes(engine, kind, c, layers, position)
    points = [point_of(kind, layer) for layer in rows]
    m_clean, m_corrupted, clean_values = baselines(engine, c, points)
    metric = np.empty((len(rows), len(columns)))
    for r, point in enumerate(points):
        clean = clean_values[point]
        for j, column in enumerate(columns):
            where = index_of(kind, column, position)

            def moved(a: np.ndarray, where=where, clean=clean) -> None:
                a[where] = clean[where]

            hook = lambda value, name, moved=moved: engine.edited(value, moved)  # noqa: E731
            metric[r, j] = c.metric(engine.last_logits(c.corrupted, {point: hook}))
    return PatchGrid(kind, rows, columns, metric, m_clean, m_corrupted,
                     position if kind == "heads" else None)

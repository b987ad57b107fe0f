"""Queries and keys on their way into attention: QK-norm, then the rotary turn, in one pass.

    x_hat = x r,  r = 1 / sqrt(mean(x^2) + eps)    each head's vector over d_k, no gain
                                                   (model.qk_norm; RMSNorm without gamma)
    y_2j + i y_2j+1 = (x_hat_2j + i x_hat_2j+1) e^(i p omega_j)      (RoPE: pair j at position p)

and back through both in reverse: the turn is a rotation, so its transpose turns the other way,
dx_hat = dy e^(-i p omega_j) read as complex numbers, then RMSNorm's backward with g = dx_hat,
dx = r (g - x_hat mean(g x_hat)) (docs/derivations/rmsnorm.md#backward,
docs/derivations/positions.md). The NumPy engine composes the same two units
(sheepop.scratch.qk_norm.with_qk_norm).

Written as torch's composite (F.rms_norm, then the real arithmetic of `Positions.rotate`) this
was ten-odd passes over the queries and keys, each casting between bf16 and float32 under
autocast: 2.1x the whole unit's time here at the speedrun's shape (benchmarks/speedrun.py
--step-parts, docs/speedrun.md). Here: one cast in, the norm's one pass, one complex product,
one cast out. Under torch.compile the composite is kept: inductor fuses it itself, and complex
numbers it does not compile.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from sheepop.model.norm import rms_backward, rms_scale, wide_dtype
from sheepop.model.positions import Pos, Positions


def turn(x: torch.Tensor, turns: torch.Tensor) -> torch.Tensor:
    """x (..., d_k) with its pairs (x_2j, x_2j+1) multiplied as complex numbers by turns
    (..., d_k / 2) (a new tensor; x contiguous, float32 or float64)."""
    return torch.view_as_real(torch.view_as_complex(x.unflatten(-1, (-1, 2))) * turns).flatten(-2)


class _NormTurn(torch.autograd.Function):
    """Normalise (eps not None) and turn (turns not None); computed in float32 at least."""

    @staticmethod
    def forward(ctx: Any, qk: torch.Tensor, eps: float | None, turns: torch.Tensor | None
                ) -> torch.Tensor:
        x = widened(qk)
        r = None
        if eps is not None:
            r = rms_scale(x, eps)
            x.mul_(r)
        # qk itself is kept (a view of the projection, which attention's values keep alive
        # anyway), not x_hat: a float32 copy a layer more memory a step, faulted in anew
        ctx.save_for_backward(qk if r is not None else None, r, turns)
        ctx.qk_dtype = qk.dtype
        if turns is not None:
            x = turn(x, turns)
        return x.to(qk.dtype)

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, None, None]:
        qk, r, turns = ctx.saved_tensors
        g = widened(dy)
        if turns is not None:
            g = turn(g, turns.conj())
        if r is not None:
            g = rms_backward(g, widened(qk).mul_(r), r)
        return g.to(ctx.qk_dtype), None, None


def widened(x: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of x in float32 at least, in one pass (a strided view of the heads,
    cast as it is, stays strided, and every pass after it slower)."""
    return x.to(wide_dtype(x), memory_format=torch.contiguous_format, copy=True)


def norm_and_turn(qk: torch.Tensor, eps: float | None, positions: Positions | None,
                  pos: Pos) -> torch.Tensor:
    """The queries and keys stacked on the head axis (B, H + H_kv, T, d_k), RMS-normalised when
    eps is given, then turned by `positions` (RoPE; other kinds do not turn)."""
    if torch.compiler.is_compiling():
        if eps is not None:
            qk = F.rms_norm(qk, (qk.size(-1),), eps=eps)
        return positions.rotate(qk, pos) if positions is not None else qk
    turns = positions.turns(pos, qk) if positions is not None else None
    if eps is None and turns is None:
        return qk
    return _NormTurn.apply(qk, eps, turns)

"""Logit soft-capping of the torch engine (model.logit_softcap = c; 0 is off).

    y = c tanh(z / c)                  every logit squashed smoothly into (-c, c)
    dz = dy (1 - tanh^2(z / c)) = dy (1 - (y / c)^2)

(docs/derivations/head-and-loss.md#soft-capping; the NumPy engine's unit is
sheepop.scratch.softcap, the same formulas). One autograd Function that keeps y, its output,
and nothing else: the head's logits are the step's largest tensor (2,048 x 4,096 at the
speedrun's BPE scale), and torch's composite made six of that size (z / c, tanh, c tanh and
their gradients), and under bf16 autocast ran tanh in bf16, slower than float32's. Here it is
computed in float32 at least and returned so, which the loss reads as it is (it promotes bf16
logits to float32 anyway); the backward makes only dz, in z's dtype. Under torch.compile the
composite is kept: inductor fuses it itself.
"""

from __future__ import annotations

from typing import Any

import torch

ROWS = 64  # rows of logits per piece of the backward: 1 MB of float32 at 4,096 ids


class _Softcap(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, z: torch.Tensor, cap: float) -> torch.Tensor:
        wide = torch.promote_types(z.dtype, torch.float32)
        y = torch.div(z, cap) if z.dtype == wide else z.to(wide).div_(cap)
        y.tanh_().mul_(cap)
        ctx.save_for_backward(y)
        ctx.cap, ctx.z_dtype = cap, z.dtype
        return y

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor, None]:
        (y,) = ctx.saved_tensors
        dz = torch.empty(y.shape, dtype=ctx.z_dtype, device=y.device)
        ys, dys, dzs = (t.reshape(-1, t.size(-1)) for t in (y, dy, dz))
        # dy (1 - (y / c)^2) a few rows at a time, in float32, written once in z's dtype: a
        # temporary as large as the logits would be a fresh allocation each step (above
        # glibc's mmap threshold), its pages faulted in anew, which cost more than the
        # arithmetic (benchmarks/speedrun.py --step-parts measures CPU time, faults included)
        for i in range(0, ys.size(0), ROWS):
            rows = slice(i, i + ROWS)
            t = ys[rows].square().mul_(-1.0 / ctx.cap ** 2).add_(1.0)
            torch.mul(t, dys[rows], out=dzs[rows])
        return dz, None


def softcap(z: torch.Tensor, cap: float) -> torch.Tensor:
    """c tanh(z / c), or z itself when cap is 0."""
    if not cap:
        return z
    if torch.compiler.is_compiling():
        return cap * torch.tanh(z / cap)
    return _Softcap.apply(z, cap)

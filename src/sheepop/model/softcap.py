"""Logit soft-capping of the torch engine (model.logit_softcap = c; 0 is off).

    y = c tanh(z / c)                  every logit squashed smoothly into (-c, c)
    dz = dy (1 - tanh^2(z / c)) = dy (1 - (y / c)^2)

(docs/derivations/head-and-loss.md#soft-capping; the NumPy engine's unit is
sheepop.scratch.softcap, the same formulas). One autograd Function that keeps y, its output,
and nothing else: the head's logits are the step's largest tensor (2,048 x 4,096 at the
speedrun's BPE scale), and torch's composite made five of that size (z / c, tanh, c tanh and
their gradients), each a fresh allocation, and under bf16 autocast ran tanh in bf16, slower than
float32's. Here it is computed in float32 at least and returned so, which the loss reads as it
is (it promotes bf16 logits to float32 anyway). Under torch.compile the composite is kept:
inductor fuses it itself.
"""

from __future__ import annotations

from typing import Any

import torch


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
        # 1 - (y / c)^2 in one temporary: y^2, times -1/c^2, plus 1, times dy
        dz = y.square().mul_(-1.0 / ctx.cap ** 2).add_(1.0).mul_(dy)
        return dz.to(ctx.z_dtype), None


def softcap(z: torch.Tensor, cap: float) -> torch.Tensor:
    """c tanh(z / c), or z itself when cap is 0."""
    if not cap:
        return z
    if torch.compiler.is_compiling():
        return cap * torch.tanh(z / cap)
    return _Softcap.apply(z, cap)

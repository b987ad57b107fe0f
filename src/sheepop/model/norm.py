"""Normalisation layers of the torch engine, one per `model.norm` kind.

    layernorm   y = gamma * (x - mu) / sqrt(var + eps) + beta   (mu, biased var over features)
    rmsnorm     y = gamma * x / sqrt(mean(x^2) + eps)            (no centring, no shift)

Each takes the width d and eps and keeps its parameters as `weight` (and `bias`), the names both
engines and the checkpoint use. LayerNorm is torch's own fused kernel. RMSNorm is `RMSNorm`
below, one autograd Function with its backward written out (docs/derivations/rmsnorm.md):

    r = 1 / sqrt(mean(x^2) + eps),  x_hat = x r,  y = gamma x_hat
    dx = r (g - x_hat mean(g x_hat)),  g = dy gamma;   dgamma = sum over rows of dy x_hat

torch 2.13's F.rms_norm runs its forward as one kernel but goes back through autograd's
composite (a MulBackward per factor, a mean, a pow), 2.4x LayerNorm's forward and backward at the
speedrun's 2,048 x 384 (benchmarks/speedrun.py --step-parts, docs/speedrun.md). Under
torch.compile the composite is kept: inductor fuses it into one kernel of its own.

The NumPy engine's units are in sheepop/scratch/norm.py (`rmsnorm_forward`, `rmsnorm_backward`:
the same formulas); the mathematics in docs/derivations/layernorm.md and
docs/derivations/rmsnorm.md.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from sheepop.config.schema import ModelConfig


def wide_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype a normalisation computes in: float32 at least (bf16's 8 bits of mantissa would
    round the mean square), float64 kept."""
    return torch.promote_types(x.dtype, torch.float32)


def rms_scale(x: torch.Tensor, eps: float) -> torch.Tensor:
    """r = 1 / sqrt(mean(x^2) + eps) over the last axis, kept as an axis of 1: the norm's one
    pass (no temporary as wide as x), squared. x in float32 at least: torch's kernels on mixed
    dtypes (a bf16 x read into float32) take a slow path, 2-3x a cast and the same kernel."""
    return torch.linalg.vector_norm(x, dim=-1, keepdim=True).square_().div_(x.size(-1)) \
        .add_(eps).rsqrt_()


def rms_backward(g: torch.Tensor, x_hat: torch.Tensor, r: torch.Tensor,
                 mean: torch.Tensor | None = None) -> torch.Tensor:
    """dx = r (g - x_hat mean(g x_hat)) from g = dL/dx_hat (docs/derivations/rmsnorm.md#backward),
    written into g (the caller passes a tensor of its own); `mean`, mean(g x_hat) (..., 1), when
    the caller has it already."""
    if mean is None:
        mean = torch.linalg.vecdot(g, x_hat).unsqueeze(-1).div_(x_hat.size(-1))
    return g.addcmul_(x_hat, mean, value=-1).mul_(r)


class _RMSNorm(torch.autograd.Function):
    """y = gamma x r with the backward above. Keeps x (the residual stream, alive anyway: what
    LayerNorm keeps too) and r, and forms x_hat again going back: a new float32 x_hat per norm
    was 13 tensors of the residual's size more memory a step, which a step then faults in anew
    (the VM's page faults cost more of the wall clock than the pass that recomputes it)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        wide = x.to(wide_dtype(x))
        r = rms_scale(wide, eps)
        ctx.save_for_backward(x, weight, r)
        return (wide * r).mul_(weight).to(torch.promote_types(x.dtype, weight.dtype))

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight, r = ctx.saved_tensors
        x_hat = x.to(r.dtype) * r
        d = x_hat.size(-1)
        # dy x_hat, once: its column sums are dgamma, and its rows times gamma (one product of a
        # matrix and a vector) are sum(g x_hat), g = dy gamma, which dx's mean needs
        dy_x_hat = (dy * x_hat).flatten(0, -2)
        dweight = dy_x_hat.sum(0).to(weight.dtype) if ctx.needs_input_grad[1] else None
        dx = None
        if ctx.needs_input_grad[0]:
            mean = (dy_x_hat @ weight.to(dy_x_hat.dtype)).div_(d).view(*x_hat.shape[:-1], 1)
            dx = rms_backward(dy * weight, x_hat, r, mean).to(x.dtype)
        return dx, dweight, None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """gamma * x / sqrt(mean(x^2) + eps) over the last axis, through `_RMSNorm` (eagerly) or
    F.rms_norm (under torch.compile, which fuses the composite itself)."""
    if torch.compiler.is_compiling():
        return F.rms_norm(x, (x.size(-1),), weight, eps)
    return _RMSNorm.apply(x, weight, eps)


class RMSNorm(nn.Module):
    """y = gamma * x / sqrt(mean(x^2) + eps); gamma is `weight` (ones at the start), as in
    nn.RMSNorm, whose state dict it shares."""

    def __init__(self, d: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.weight.size(0)}, eps={self.eps}"


NORMS = {"layernorm": lambda d, eps: nn.LayerNorm(d, eps=eps),
         "rmsnorm": RMSNorm}


def make_norm(cfg: ModelConfig) -> nn.Module:
    return NORMS[cfg.norm](cfg.n_embd, cfg.ln_eps)

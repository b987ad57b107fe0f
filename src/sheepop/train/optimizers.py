"""The torch engine's optimizers: AdamW alone, or Muon for the blocks' matrices beside AdamW.

The groups are the shared rule `sheepop.arch.params.uses_muon` (the NumPy engine uses it too).
Muon's learning rate follows the same schedule as AdamW's, scaled to its own peak:
lr_muon(t) = train.muon_lr * lr(t) / train.lr. Its matrices take no weight decay (nanochat's and
modded-nanogpt's choice: the orthogonalised step has a fixed size whatever the gradient's).

`StackedMuon` is torch.optim.Muon with sheepop's Newton-Schulz iteration: the matrices of one
shape in one batched product, through the Gram matrix where that takes fewer flops. torch's runs
in bfloat16 always; on a CPU without bf16 instructions every bf16 product is emulated (tens of
times slower than float32, docs/performance.md), so `train.muon_ns_dtype` chooses, auto by the
device: bfloat16 where it has the instructions, else the parameter's own dtype.
"""

from __future__ import annotations

from typing import Any

import torch

from sheepop.arch.params import decays, uses_muon
from sheepop.config.schema import TrainConfig
from sheepop.scratch.muon import left_factor

# The Gram form's m x m products in half precision drift (A <- Q A Q, nothing recomputes A from
# X): after this many steps it starts again from X, as the plain iteration does every step
# (docs/derivations/muon.md, "In bfloat16: restarted").
HALF_PRECISION_GRAM_STEPS = 3


def newton_schulz(m: torch.Tensor, steps: int, coefficients: tuple[float, float, float],
                  eps: float) -> torch.Tensor:
    """NS_k(M) in M's own dtype: k steps of X <- a X + (b A + c A^2) X, A = X X^T, from
    X = M / ||M||_F, on the side with fewer rows; for a matrix over 1.5x as wide as tall, the
    same polynomial through the Gram matrix alone, Q_{k-1} ... Q_0 X_0 (fewer flops; the
    NumPy engine's unit, scratch/muon.py, derives both, and its `left_factor` serves both
    engines), in half precision restarted from X every HALF_PRECISION_GRAM_STEPS steps. M may
    be a stack (n, rows, cols) of matrices of one shape: one batched product for all of them."""
    a, b, c = coefficients
    tall = m.size(-2) > m.size(-1)
    x = m.mT if tall else m
    x = x / x.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)
    if steps > 0 and x.size(-1) > 1.5 * x.size(-2):
        segment = steps if x.element_size() > 2 else HALF_PRECISION_GRAM_STEPS
        for done in range(0, steps, segment):
            x = left_factor(x @ x.mT, min(segment, steps - done), a, b, c) @ x
    else:
        for _ in range(steps):
            gram = x @ x.mT
            x = a * x + (b * gram + c * (gram @ gram)) @ x
    return x.mT if tall else x


class StackedMuon(torch.optim.Muon):
    """torch.optim.Muon's update (the same lerps, decay and shape scale; its state and
    settings) with sheepop's iteration: in `ns_dtype` (torch's is always bfloat16; None: the
    parameter's own), through the Gram matrix where a matrix is wide (`newton_schulz`), the
    matrices of one shape orthogonalised together. A layer's matrices come in a few shapes
    repeated n_layer times, and one batched product costs about what one small product does
    (16 separate small iterations made Muon's step 2x AdamW's on a 4-layer model,
    docs/speedrun.md); the Gram form halves the bfloat16 iteration's time at the BPE
    speedrun's shape (docs/derivations/muon.md)."""

    def __init__(self, params: Any, ns_dtype: torch.dtype | None, **settings: Any):
        super().__init__(params, **settings)
        self.ns_dtype = ns_dtype

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        for group in self.param_groups:
            lr, mu = group["lr"], group["momentum"]
            by_shape: dict[tuple[int, ...], list[tuple[torch.Tensor, torch.Tensor]]] = {}
            for p in group["params"]:
                if p.grad is None:
                    continue
                buf = self.state[p].setdefault("momentum_buffer", torch.zeros_like(p))
                buf.lerp_(p.grad, 1 - mu)
                update = p.grad.lerp(buf, mu) if group["nesterov"] else buf
                by_shape.setdefault(tuple(p.shape), []).append((p, update))
            for (rows, cols), pairs in by_shape.items():
                stacked = torch.stack([update for _, update in pairs])
                stacked = stacked.to(self.ns_dtype or stacked.dtype)
                ortho = newton_schulz(stacked, group["ns_steps"], group["ns_coefficients"],
                                      group["eps"])
                for (p, _), o in zip(pairs, ortho):
                    if group["weight_decay"]:  # torch multiplies by 1 - 0 too: the same p
                        p.mul_(1 - lr * group["weight_decay"])
                    p.add_(o, alpha=-lr * max(1.0, rows / cols) ** 0.5)


def decay_groups(params: list[torch.nn.Parameter], weight_decay: float) -> list[dict[str, Any]]:
    """AdamW's two groups: matrices (embeddings, linear weights) decay; biases and norm gains
    do not (sheepop.arch.params.decays)."""
    return [{"params": [p for p in params if decays(p.shape)], "weight_decay": weight_decay},
            {"params": [p for p in params if not decays(p.shape)], "weight_decay": 0.0}]


def muon_ns_dtype(cfg: TrainConfig, native_bf16: bool) -> torch.dtype | None:
    """train.muon_ns_dtype: bfloat16, auto where the device has bf16 instructions; else None,
    the parameters' own dtype (float32, or float64 in a float64 run)."""
    if cfg.muon_ns_dtype == "bfloat16" or (cfg.muon_ns_dtype == "auto" and native_bf16):
        return torch.bfloat16
    return None


def build_optimizers(named: list[tuple[str, torch.nn.Parameter]], cfg: TrainConfig,
                     fused: bool, native_bf16: bool) -> list[torch.optim.Optimizer]:
    """[AdamW] or [AdamW, Muon] over the trainable (name, parameter) pairs; AdamW's groups decay
    matrices only (sheepop.arch.params.decays)."""
    muon = [p for n, p in named if cfg.optimizer == "muon" and uses_muon(n, p.shape)]
    chosen = {id(p) for p in muon}
    rest = [p for _, p in named if id(p) not in chosen]
    adamw = torch.optim.AdamW(decay_groups(rest, cfg.weight_decay), lr=cfg.lr,
                              betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, fused=fused)
    if not muon:
        return [adamw]
    return [adamw, StackedMuon(muon, muon_ns_dtype(cfg, native_bf16), lr=cfg.muon_lr,
                               momentum=cfg.muon_momentum, nesterov=True, weight_decay=0.0,
                               ns_steps=cfg.muon_ns_steps)]


def set_lr(optimizers: list[torch.optim.Optimizer], lr: float, cfg: TrainConfig) -> None:
    """AdamW at the schedule's lr; Muon at its own peak times the same schedule's factor."""
    for opt in optimizers:
        value = cfg.muon_lr * lr / cfg.lr if isinstance(opt, torch.optim.Muon) else lr
        for group in opt.param_groups:
            group["lr"] = value

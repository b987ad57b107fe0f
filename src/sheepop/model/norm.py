"""Normalisation layers of the torch engine, one per `model.norm` kind.

    layernorm   y = gamma * (x - mu) / sqrt(var + eps) + beta   (mu, biased var over features)
    rmsnorm     y = gamma * x / sqrt(mean(x^2) + eps)            (no centring, no shift)

Each takes the width d and eps and keeps its parameters as `weight` (and `bias`), the names both
engines and the checkpoint use. The NumPy engine's units are in sheepop/scratch/norm.py; the
mathematics in docs/derivations/layernorm.md and docs/derivations/rmsnorm.md.
"""

from __future__ import annotations

import torch.nn as nn

from sheepop.config.schema import ModelConfig

NORMS = {"layernorm": lambda d, eps: nn.LayerNorm(d, eps=eps),
         "rmsnorm": lambda d, eps: nn.RMSNorm(d, eps=eps)}


def make_norm(cfg: ModelConfig) -> nn.Module:
    return NORMS[cfg.norm](cfg.n_embd, cfg.ln_eps)

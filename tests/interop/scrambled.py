"""Random weights of a real size for the interop tests' `transformers` models."""

from __future__ import annotations

import torch


def scramble(module: torch.nn.Module, seed: int) -> None:
    """Every parameter random and O(0.1-1), so that no mapping mistake hides in tiny logits."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.5 if p.dim() == 1 else 0.2))

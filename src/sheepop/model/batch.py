"""Left padding for batched generation: prompts of different lengths in one (B, L) tensor.

Each prompt is right-aligned, so every row's next token goes in the same column. Two things keep
the padding from changing any row's output:

- positions count from each row's first real token: pos[b, t] = t - pad_b (padding: 0), so a
  prompt sees the same positional rows as when it runs alone;
- a key mask (True at real tokens) hides padding keys from every real query.

What the padding positions compute themselves is discarded.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

PAD_ID = 0  # any valid id: padding tokens are embedded but never seen by a real token


def left_pad(rows: Sequence[Sequence[int]], device: torch.device | str = "cpu"
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token ids (B, L), position ids (B, L) and the real-token mask (B, L) of `rows`."""
    if not rows or any(len(r) == 0 for r in rows):
        raise ValueError("every row of a batch needs at least one token")
    L = max(len(r) for r in rows)
    idx = torch.full((len(rows), L), PAD_ID, dtype=torch.long)
    real = torch.zeros((len(rows), L), dtype=torch.bool)
    for b, row in enumerate(rows):
        idx[b, L - len(row):] = torch.as_tensor(list(row), dtype=torch.long)
        real[b, L - len(row):] = True
    pos = (real.long().cumsum(dim=1) - 1).clamp(min=0)
    return idx.to(device), pos.to(device), real.to(device)

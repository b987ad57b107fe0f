"""Position encodings of the torch engine, one class per `model.pos_encoding` kind.

A kind acts in one or both of two places (docs/math/03-positions.md):

    embed(x, pos)     x + P[pos] on the token embeddings (sinusoidal, learned)
    rotate(q, k, pos) on each head's queries and keys, inside attention (none yet: identity)

`pos` is a slice (every row at positions start .. start+T-1) or an index tensor (B, T) (each
row of a left-padded batch counts from its own first real token); `table[pos]` reads either.
The NumPy engine's units are in sheepop/scratch/positions.py.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from sheepop.config import ModelConfig
from sheepop.positional import sinusoidal_table

Pos = slice | torch.Tensor


class Positions(nn.Module):
    """The identity in both places; a kind overrides what it does."""

    def embed(self, x: torch.Tensor, pos: Pos) -> torch.Tensor:
        return x

    def rotate(self, q: torch.Tensor, k: torch.Tensor, pos: Pos
               ) -> tuple[torch.Tensor, torch.Tensor]:
        return q, k


class SinusoidalPositions(Positions):
    """x + s * P[pos], P the fixed sinusoidal table (sheepop.positional), s = cfg.sinusoid_scale.
    Computed, not learned: a buffer, not a parameter (nothing in the checkpoint)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        table = sinusoidal_table(cfg.block_size, cfg.n_embd) * cfg.sinusoid_scale
        self.register_buffer("table", torch.from_numpy(table).float(), persistent=False)

    def embed(self, x: torch.Tensor, pos: Pos) -> torch.Tensor:
        return x + self.table[pos]


class LearnedPositions(Positions):
    """x + P[pos], P a learned (block_size, d) table: the parameter `pos_emb.weight`."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(cfg.block_size, cfg.n_embd))

    def embed(self, x: torch.Tensor, pos: Pos) -> torch.Tensor:
        return x + self.weight[pos]


POSITIONS = {"sinusoidal": SinusoidalPositions, "learned": LearnedPositions}


def make_positions(cfg: ModelConfig) -> Positions:
    return POSITIONS[cfg.pos_encoding](cfg)

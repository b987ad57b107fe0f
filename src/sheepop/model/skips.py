"""U-net skip connections in the torch engine (model.unet_skips;
docs/derivations/skip-connections.md).

    x_i = h_(i-1) + w_k h_s     when block i takes a skip (s, k) (sheepop.arch.links): the
                                first half's outputs h_s reach the mirrored second half

`Skips` runs the stack of blocks: before each block it adds the skip that block takes, after it
keeps the output a later skip reads. Without model.unet_skips no block takes one and the loop is
the plain one. Autograd derives the backward; the NumPy engine's unit (sheepop.scratch.skips)
writes it out.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn

from sheepop.arch.links import kept_outputs, skip_links
from sheepop.config.schema import ModelConfig


class Skips(nn.Module):
    """The skip weights w (L // 2, ones at first) and the loop over the blocks that uses them."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.links = skip_links(cfg)
        self.keeps = kept_outputs(cfg)
        self.weights = nn.Parameter(torch.ones(cfg.n_layer // 2)) if self.keeps else None

    def forward(self, x: torch.Tensor, block: Callable[[int, torch.Tensor], torch.Tensor]
                ) -> torch.Tensor:
        """The stream after every block, `block(i, x)` running block i on its input x."""
        kept = {}
        for i, link in enumerate(self.links):
            if link is not None:
                x = x + self.weights[link.weight] * kept[link.source]
            x = block(i, x)
            if i in self.keeps:
                kept[i] = x
        return x

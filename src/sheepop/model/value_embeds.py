"""Value embeddings in the torch engine (model.value_embeds; docs/derivations/value-embeddings.md).

    R_j = T_j[x],   v' = lam v + (1 - lam) R_j    in the layers that read table j
                                                  (sheepop.arch.links), lam = lambdas[k]

`ValueEmbeddings` holds the N tables and the lambdas under the checkpoint's names
(value_embeds.{j}.weight, value_embeds.lambdas) and gives each layer its (R_j, lam) once per
forward pass; the attention mixes them into its values with `mix_values` before the KV cache
stores them. Autograd derives the backward; the NumPy engine's unit
(sheepop.scratch.value_embeds) writes it out.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from sheepop.arch.links import value_links
from sheepop.config.schema import ModelConfig

ValueMix = tuple[torch.Tensor, torch.Tensor]  # (R_j (B, T, H_kv d_k), lam (0-d))


class ValueEmbeddings(nn.ModuleList):
    """N tables T_j (V, H_kv d_k) and one lambda per layer that reads a table."""

    def __init__(self, cfg: ModelConfig):
        width = cfg.kv_heads * cfg.head_dim
        super().__init__(nn.Embedding(cfg.vocab_size, width) for _ in range(cfg.value_embeds))
        self.links = value_links(cfg)
        self.lambdas = nn.Parameter(torch.full((sum(x is not None for x in self.links),), 0.5))

    def per_layer(self, idx: torch.Tensor) -> list[ValueMix | None]:
        """Each layer's (R_j, lam), None where it reads no table: each table looked up once."""
        rows = [F.embedding(idx, table.weight) for table in self]
        return [None if link is None else (rows[link.table], self.lambdas[link.mix])
                for link in self.links]


def mix_values(v: torch.Tensor, mix: ValueMix) -> torch.Tensor:
    """lam v + (1 - lam) R for values v (B, H_kv, T, d_k), R split into heads as v is."""
    rows, lam = mix
    B, H, T, dk = v.shape
    return lam * v + (1 - lam) * rows.view(B, T, H, dk).transpose(1, 2)

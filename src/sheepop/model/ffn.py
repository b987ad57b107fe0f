"""Feed-forward networks of the torch engine, one class per `model.ffn` kind.

    mlp   FFN(x) = act(x W_fc^T + b_fc) W_proj^T + b_proj,   act = model.activation

The NumPy engine's units are in sheepop/scratch/ffn.py.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from sheepop.config import ModelConfig

ACTIVATIONS = {
    "gelu": lambda x: F.gelu(x),                        # x * Phi(x), Phi the normal CDF (erf)
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}


class MLP(nn.Module):
    """FFN(x) = act(x W_fc^T + b_fc) W_proj^T + b_proj."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.n_embd, cfg.ffn_dim, bias=cfg.bias)
        self.proj = nn.Linear(cfg.ffn_dim, cfg.n_embd, bias=cfg.bias)
        self.act = ACTIVATIONS[cfg.activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.act(self.fc(x)))


FFNS = {"mlp": MLP}


def make_ffn(cfg: ModelConfig) -> nn.Module:
    return FFNS[cfg.ffn](cfg)

"""Feed-forward networks of the torch engine, one class per `model.ffn` kind.

    mlp      FFN(x) = act(x W_fc^T + b_fc) W_proj^T + b_proj,   act = model.activation
    swiglu   FFN(x) = (silu(x W_gate^T + b_gate) * (x W_up^T + b_up)) W_proj^T + b_proj,
             silu(z) = z sigmoid(z): W2 (silu(W1 x) * W3 x) in the paper's names

The NumPy engine's units are in sheepop/scratch/ffn.py; the mathematics in
docs/derivations/mlp.md and docs/derivations/swiglu.md.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from sheepop.arch.hooks import LayerHooks
from sheepop.config.schema import ModelConfig


class _ReluSquared(torch.autograd.Function):
    """y = r^2 with r = max(u, 0), du = 2 r dy (docs/derivations/mlp.md): keeps r alone, and
    goes back in two passes, r dy then times 2, where autograd's relu-then-square went back
    through pow's and the threshold's backwards (three, and a temporary more); the same values
    bit for bit (times 2 is exact: round(r dy) 2 = round(2 r dy))."""

    @staticmethod
    def forward(ctx: Any, u: torch.Tensor) -> torch.Tensor:
        r = torch.relu(u)
        ctx.save_for_backward(r)
        return r.square()

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> torch.Tensor:
        (r,) = ctx.saved_tensors
        return torch.mul(r, dy).mul_(2.0)


def relu_squared(u: torch.Tensor) -> torch.Tensor:
    """max(u, 0)^2 (Primer, modded-nanogpt): `_ReluSquared` eagerly, the composite under
    torch.compile (inductor fuses it itself)."""
    if torch.compiler.is_compiling():
        return F.relu(u).square()
    return _ReluSquared.apply(u)


ACTIVATIONS = {
    "gelu": lambda x: F.gelu(x),                        # x * Phi(x), Phi the normal CDF (erf)
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "relu2": relu_squared,                              # max(x, 0)^2
    "silu": F.silu,                                     # x * sigmoid(x)
}


class MLP(nn.Module):
    """FFN(x) = act(x W_fc^T + b_fc) W_proj^T + b_proj."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.n_embd, cfg.ffn_dim, bias=cfg.bias)
        self.proj = nn.Linear(cfg.ffn_dim, cfg.n_embd, bias=cfg.bias)
        self.act = ACTIVATIONS[cfg.activation]

        self.hooks: LayerHooks | None = None  # set for one pass by sheepop.model.hooks

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.hooks is None:
            return self.proj(self.act(self.fc(x)))
        u = self.hooks.at("ffn.pre", self.fc(x))
        return self.proj(self.hooks.at("ffn.hidden", self.act(u)))


class SwiGLU(nn.Module):
    """FFN(x) = (silu(x W_gate^T) * x W_up^T) W_proj^T (+ biases): a gated linear unit whose gate
    is silu (Shazeer 2020), the feed-forward of Llama."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate = nn.Linear(cfg.n_embd, cfg.ffn_dim, bias=cfg.bias)
        self.up = nn.Linear(cfg.n_embd, cfg.ffn_dim, bias=cfg.bias)
        self.proj = nn.Linear(cfg.ffn_dim, cfg.n_embd, bias=cfg.bias)

        self.hooks: LayerHooks | None = None  # set for one pass by sheepop.model.hooks

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.hooks is None:
            return self.proj(F.silu(self.gate(x)) * self.up(x))
        g, up = self.hooks.at("ffn.pre", self.gate(x)), self.hooks.at("ffn.up", self.up(x))
        return self.proj(self.hooks.at("ffn.hidden", F.silu(g) * up))


FFNS = {"mlp": MLP, "swiglu": SwiGLU}


def make_ffn(cfg: ModelConfig) -> nn.Module:
    return FFNS[cfg.ffn](cfg)

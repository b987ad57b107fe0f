"""LoRA in the torch engine: a linear layer with a trainable low-rank update, and the model
surgery that puts it in place (docs/derivations/lora.md; docs/finetune.md, "LoRA: the
mathematics").

    y = x W^T + b + s (x A^T) B^T,     A (r, in), B (out, r), s = alpha / r, W and b frozen

`add_lora` swaps each targeted nn.Linear (sheepop.arch.lora.lora_targets) for a `LoRALinear`
that keeps the SAME `weight` and `bias` Parameter objects under the same names, so the model's
parameter names stay the checkpoint's ("blocks.0.attn.qkv.weight") and the adapters appear
beside them ("blocks.0.attn.qkv.lora_A"); every other parameter is frozen (requires_grad False),
so autograd computes no gradient for the base model and an optimizer built over the parameters
that require a gradient trains the adapters only. The NumPy engine's unit is
sheepop.scratch.lora (the plain model on W' = W + s B A).

With `lora.new_tokens` = n, the embedding (and an untied head) become `NewRowsEmbedding` /
`NewRowsHead`: the frozen table stays under its name, and a trainable `new_rows` (n, d) (and
`new_bias` (n,)) replaces its last n rows in the forward pass, E' = [E[:V-n]; new_rows], so
gradients reach only the new tokens' rows.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from sheepop.arch.lora import (
    LoraConfig,
    check_adapters,
    init_adapters,
    is_adapter,
    lora_targets,
    new_row_names,
)
from sheepop.model.gpt import Head, TokenEmbedding


def _replace_last(table: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """[table[:V-n]; rows] (autograd reaches `rows`, never the frozen first V-n rows)."""
    return torch.cat([table[:table.shape[0] - rows.shape[0]], rows.to(table.dtype)])


class NewRowsEmbedding(TokenEmbedding):
    """The token embedding with its last n rows trained: table() = [E[:V-n]; new_rows]."""

    def __init__(self, base: TokenEmbedding, n: int):
        super().__init__(base.num_embeddings, base.embedding_dim, _weight=base.weight)
        self.weight = base.weight
        self.new_rows = nn.Parameter(base.weight[-n:].detach().clone())
        self.active = True  # False: the base table (`adapters_off`)

    def table(self) -> torch.Tensor:
        return _replace_last(self.weight, self.new_rows) if self.active else self.weight

    def merged(self) -> TokenEmbedding:
        with torch.no_grad():
            self.weight[-self.new_rows.shape[0]:] = self.new_rows
        plain = TokenEmbedding(self.num_embeddings, self.embedding_dim, _weight=self.weight)
        plain.weight = self.weight
        return plain


class NewRowsHead(Head):
    """The head with its last n rows (and bias entries) trained: an untied W_head' =
    [W[:V-n]; new_rows], b' = [b[:V-n]; new_bias]; a tied head reads the embedding's table()."""

    def __init__(self, base: Head, n: int):
        nn.Module.__init__(self)
        self.weight, self.bias = base.weight, base.bias
        if base.weight is not None:
            self.new_rows = nn.Parameter(base.weight[-n:].detach().clone())
        if base.bias is not None:
            self.new_bias = nn.Parameter(base.bias[-n:].detach().clone())
        self.active = True  # False: the base head (`adapters_off`)

    def forward(self, x: torch.Tensor, tied_weight: torch.Tensor) -> torch.Tensor:
        if not self.active:
            return F.linear(x, tied_weight if self.weight is None else self.weight, self.bias)
        w = tied_weight if self.weight is None else _replace_last(self.weight, self.new_rows)
        b = None if self.bias is None else _replace_last(self.bias, self.new_bias)
        return F.linear(x, w, b)

    def merged(self, cfg) -> Head:
        """A plain Head over the same Parameters, the trained rows written into their tables."""
        plain = Head(cfg)
        with torch.no_grad():
            if self.weight is not None:
                self.weight[-self.new_rows.shape[0]:] = self.new_rows
            if self.bias is not None:
                self.bias[-self.new_bias.shape[0]:] = self.new_bias
        plain.weight, plain.bias = self.weight, self.bias
        return plain


class LoRALinear(nn.Module):
    """y = x W^T + b + s (x A^T) B^T: the base layer's own `weight` and `bias` Parameters, and
    the adapter's `lora_A` (r, in) and `lora_B` (out, r). The update goes through the rank-r
    bottleneck x A^T; B A (out, in) is never formed."""

    def __init__(self, base: nn.Linear, rank: int, scale: float):
        super().__init__()
        out_features, in_features = base.weight.shape
        self.in_features, self.out_features, self.scale = in_features, out_features, scale
        self.register_parameter("weight", base.weight)
        self.register_parameter("bias", base.bias)
        like = dict(dtype=base.weight.dtype, device=base.weight.device)
        self.lora_A = nn.Parameter(torch.zeros(rank, in_features, **like))
        self.lora_B = nn.Parameter(torch.zeros(out_features, rank, **like))
        self.active = True  # False: the base layer alone (`adapters_off`)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.active:
            return F.linear(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias) + self.scale * F.linear(
            F.linear(x, self.lora_A), self.lora_B)

    def merged_weight(self) -> torch.Tensor:
        """W + s B A."""
        return self.weight + self.scale * (self.lora_B @ self.lora_A)


def add_lora(model: nn.Module, lora: LoraConfig, adapters: dict[str, np.ndarray] | None = None,
             seed: int = 0) -> nn.Module:
    """Put adapters on `model` (a sheepop GPT, in place; returned): `adapters` (a checkpoint's,
    checked against `lora`) or fresh ones (sheepop.arch.lora.init_adapters(seed): B = 0, the
    same values as the NumPy engine's). Freezes every parameter but the adapters (and the new
    tokens' rows)."""
    cfg = model.cfg
    for prefix in lora_targets(cfg, lora.targets):
        parent_name, _, child = prefix.rpartition(".")
        parent = model.get_submodule(parent_name)
        base = getattr(parent, child)
        if not isinstance(base, nn.Linear):
            raise ValueError(f"{prefix} is a {type(base).__name__}, not a plain linear layer "
                             "(adapters already added?)")
        setattr(parent, child, LoRALinear(base, lora.rank, lora.scale))
    if new_row_names(cfg, lora):
        model.tok_emb = NewRowsEmbedding(model.tok_emb, lora.new_tokens)
        model.head = NewRowsHead(model.head, lora.new_tokens)
    tables = {name: p.detach().float().cpu().numpy() for name, p in model.named_parameters()
              if name in new_row_names(cfg, lora).values()}
    values = init_adapters(cfg, lora, seed, weights=tables) if adapters is None else adapters
    check_adapters(cfg, lora, values)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if is_adapter(name):
                p.copy_(torch.from_numpy(np.asarray(values[name])).to(p.dtype))
            p.requires_grad_(is_adapter(name))
    model.lora = lora
    return model


@contextlib.contextmanager
def adapters_off(model: nn.Module) -> Iterator[nn.Module]:
    """The base model inside the block: every adapter skipped (y = x W^T + b) and the new
    tokens' base rows used, so its outputs are those of the model the adapters started from
    (B = 0): a reference that never moves while the adapters train. The adapters are back after
    the block, even when it raises."""
    units = [m for m in model.modules()
             if isinstance(m, (LoRALinear, NewRowsEmbedding, NewRowsHead))]
    if not units:
        raise ValueError("adapters_off needs a model with LoRA adapters")
    for unit in units:
        unit.active = False
    try:
        yield model
    finally:
        for unit in units:
            unit.active = True


def adapter_weights(model: nn.Module) -> dict[str, np.ndarray]:
    """The adapters as float32 NumPy arrays, keyed by parameter name (what a LoRA checkpoint
    saves)."""
    return {name: p.detach().float().cpu().numpy() for name, p in model.named_parameters()
            if is_adapter(name)}


def merge_lora(model: nn.Module) -> nn.Module:
    """Fold each adapter into its weight, W <- W + s B A, and the new tokens' rows into their
    tables, and put plain layers back (in place; returned): the same function, no adapters,
    every parameter trainable again."""
    if isinstance(model.tok_emb, NewRowsEmbedding):
        model.tok_emb, model.head = model.tok_emb.merged(), model.head.merged(model.cfg)
    for name, module in list(model.named_modules()):
        if isinstance(module, LoRALinear):
            parent_name, _, child = name.rpartition(".")
            plain = nn.Linear(module.in_features, module.out_features,
                              bias=module.bias is not None, device=module.weight.device,
                              dtype=module.weight.dtype)
            with torch.no_grad():
                module.weight.copy_(module.merged_weight())
            plain.weight, plain.bias = module.weight, module.bias
            setattr(model.get_submodule(parent_name), child, plain)
    for p in model.parameters():
        p.requires_grad_(True)
    model.lora = None
    return model

"""A re-implementation of nanoGPT's training step, written here to benchmark against.

What nanoGPT's `model.py` and `train.py` do in one iteration, as its README and code describe
them (this file copies no code): token plus learned position embeddings, pre-LayerNorm blocks
with biases (one fused `c_attn` projection to Q, K, V, `scaled_dot_product_attention` with
`is_causal=True`, a 4x GELU MLP), a final LayerNorm, a head tied to the token embedding,
logits for every position, `F.cross_entropy(..., ignore_index=-1)`; init N(0, 0.02) with the
residual projections at 0.02 / sqrt(2 n_layer); AdamW with weight decay on the >= 2-D
parameters only, `fused` only on CUDA; then `clip_grad_norm_(1.0)`, `step`,
`zero_grad(set_to_none=True)`. On CPU it runs float32 (no autocast).

`load_checkout(path)` takes the real thing instead: `model.py` of a nanoGPT checkout the user
points at (`benchmarks/vs_nanogpt.py --nanogpt DIR`); nothing of it is vendored here.
"""

from __future__ import annotations

import importlib.util
import inspect
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Shape:
    n_layer: int
    n_head: int
    n_embd: int
    block_size: int
    vocab_size: int
    dropout: float = 0.0
    bias: bool = True


class Attention(nn.Module):
    def __init__(self, s: Shape):
        super().__init__()
        self.c_attn = nn.Linear(s.n_embd, 3 * s.n_embd, bias=s.bias)
        self.c_proj = nn.Linear(s.n_embd, s.n_embd, bias=s.bias)
        self.n_head, self.p = s.n_head, s.dropout
        self.resid_dropout = nn.Dropout(s.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
                   for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.p if self.training else 0.0,
                                           is_causal=True)
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C)))


class MLP(nn.Module):
    def __init__(self, s: Shape):
        super().__init__()
        self.c_fc = nn.Linear(s.n_embd, 4 * s.n_embd, bias=s.bias)
        self.c_proj = nn.Linear(4 * s.n_embd, s.n_embd, bias=s.bias)
        self.dropout = nn.Dropout(s.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, s: Shape):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(s.n_embd, bias=s.bias), Attention(s)
        self.ln_2, self.mlp = nn.LayerNorm(s.n_embd, bias=s.bias), MLP(s)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class ReferenceGPT(nn.Module):
    def __init__(self, s: Shape):
        super().__init__()
        self.wte = nn.Embedding(s.vocab_size, s.n_embd)
        self.wpe = nn.Embedding(s.block_size, s.n_embd)
        self.drop = nn.Dropout(s.dropout)
        self.h = nn.ModuleList(Block(s) for _ in range(s.n_layer))
        self.ln_f = nn.LayerNorm(s.n_embd, bias=s.bias)
        self.lm_head = nn.Linear(s.n_embd, s.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * s.n_layer))
            elif p.dim() >= 2:
                nn.init.normal_(p, 0.0, 0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1),
                               ignore_index=-1)
        return logits, loss

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas,
                                 fused=device_type == "cuda")


def sheepop_names(n_layer: int) -> dict[str, str]:
    """This model's parameter names -> sheepop's (the checkpoint names of the same weights)."""
    names = {"wte.weight": "tok_emb.weight", "wpe.weight": "pos_emb.weight",
             "ln_f.weight": "ln_f.weight", "ln_f.bias": "ln_f.bias"}
    parts = {"ln_1": "ln1", "ln_2": "ln2", "attn.c_attn": "attn.qkv", "attn.c_proj": "attn.proj",
             "mlp.c_fc": "ffn.fc", "mlp.c_proj": "ffn.proj"}
    for i in range(n_layer):
        for ours, theirs in parts.items():
            for kind in ("weight", "bias"):
                names[f"h.{i}.{ours}.{kind}"] = f"blocks.{i}.{theirs}.{kind}"
    return names


def load_sheepop_weights(model: ReferenceGPT, weights: dict, n_layer: int) -> None:
    """Copy sheepop's weights (name -> array) into this model, so both start alike."""
    params = dict(model.named_parameters())
    with torch.no_grad():
        for ours, theirs in sheepop_names(n_layer).items():
            params[ours].copy_(torch.as_tensor(weights[theirs]))


def load_checkout(path: str, s: Shape) -> nn.Module:
    """nanoGPT's own `GPT` from `path/model.py` (a checkout the user has; not vendored)."""
    file = Path(path) / "model.py"
    spec = importlib.util.spec_from_file_location("nanogpt_model", file)
    if spec is None or spec.loader is None or not file.is_file():
        sys.exit(f"--nanogpt: no model.py in {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    wanted = inspect.signature(module.GPTConfig).parameters
    cfg = module.GPTConfig(**{k: v for k, v in vars(s).items() if k in wanted})
    return module.GPT(cfg)


class ReferenceStep:
    """One iteration of nanoGPT's loop (grad_accum 1): forward with the loss (under bf16
    autocast when `autocast` is set, as nanoGPT's `ctx`), backward, clip at 1.0, AdamW step,
    gradients set to None."""

    def __init__(self, model: nn.Module, lr: float = 1e-3, weight_decay: float = 0.1,
                 betas: tuple[float, float] = (0.9, 0.95), autocast: torch.dtype | None = None):
        self.model = model
        self.optimizer = model.configure_optimizers(weight_decay, lr, betas, "cpu")
        self.autocast = autocast

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> float:
        with torch.autocast("cpu", dtype=self.autocast or torch.bfloat16,
                            enabled=self.autocast is not None):
            _, loss = self.model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.item()


def nanogpt_lr(it: int, lr: float, min_lr: float, warmup: int, decay_iters: int) -> float:
    """nanoGPT's learning rate at iteration `it`: a linear warmup lr (it + 1) / (warmup + 1),
    then a cosine from lr down to min_lr at `decay_iters`, min_lr after
    (lr_t = min_lr + (lr - min_lr) (1 + cos(pi r)) / 2, r the fraction of the decay done)."""
    if it < warmup:
        return lr * (it + 1) / (warmup + 1)
    if it > decay_iters:
        return min_lr
    ratio = (it - warmup) / max(1, decay_iters - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)


@dataclass
class Recipe:
    """nanoGPT's settings for its small character model (config/train_shakespeare_char.py)."""
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup: int = 100
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.99)


def train_reference(model: nn.Module, next_batch, steps: int, evaluate, eval_every: int,
                    recipe: Recipe | None = None, autocast: torch.dtype | None = None
                    ) -> list[tuple[int, float, float]]:
    """nanoGPT's loop for `steps` iterations: the learning rate set for each, then
    `ReferenceStep`; every `eval_every` steps and at the end, `evaluate(model)` (its mean
    validation loss). Returns (step, seconds since the start, val loss) at each evaluation;
    the seconds count the evaluations, as a sheepop run's time to a target does."""
    recipe = recipe or Recipe()
    step = ReferenceStep(model, recipe.lr, recipe.weight_decay, recipe.betas, autocast)
    history = []
    t0 = time.perf_counter()
    for it in range(steps):
        for group in step.optimizer.param_groups:
            group["lr"] = nanogpt_lr(it, recipe.lr, recipe.min_lr, recipe.warmup, steps)
        x, y = (torch.as_tensor(a) for a in next_batch())
        model.train()
        step(x, y)
        if (it + 1) % eval_every == 0 or it + 1 == steps:
            model.eval()
            with torch.no_grad(), torch.autocast("cpu", dtype=autocast or torch.bfloat16,
                                                 enabled=autocast is not None):
                val = evaluate(model)
            history.append((it + 1, time.perf_counter() - t0, val))
    return history

"""The GPT of docs/architecture.md in PyTorch: a decoder-only, pre-norm transformer.

    h0 = Drop(E[x] + P[:T])            P: s * sinusoidal table (s = 1/sqrt(d)) or learned
    h  = h + Drop(Attn(LN1(h)))        for each block
    h  = h + Drop(FFN(LN2(h)))
    logits = LN_f(h) W_head^T (+ b_head)         W_head = E when tied

Parameter names match the NumPy engine (sheepop.scratch) and the checkpoint format exactly.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from sheepop.config import ModelConfig
from sheepop.errors import UserError
from sheepop.model.kv_cache import KVCache
from sheepop.positional import sinusoidal_table

IGNORE_INDEX = -1


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, reduction: str = "mean"
                  ) -> torch.Tensor:
    """L = -(1/N) sum_{t: y_t != -1} log softmax(z_t)[y_t], N = number of counted targets.

    Half-precision logits (bf16/fp16 autocast) are promoted to float32 for an accurate loss;
    float32 and float64 logits are used as they are.
    """
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1),
                           ignore_index=IGNORE_INDEX, reduction=reduction)


class CausalSelfAttention(nn.Module):
    """softmax(Q K^T / sqrt(d_k) + M) V per head, M = -inf above the diagonal; then W_proj."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_head, self.head_dim = cfg.n_head, cfg.head_dim
        self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.attn_drop = nn.Dropout(cfg.dropout)
        self.use_sdpa = True  # False: the explicit masked-softmax path (same output)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None, layer: int = 0,
                return_weights: bool = False, attn_mask: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`attn_mask`: boolean (B, 1, T, T_keys), True where a query may see a key; None is
        the plain causal mask."""
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, self.head_dim).transpose(1, 2) for t in (q, k, v))
        past = 0
        if cache is not None:
            past = cache.length
            k, v = cache.update(layer, k, v)
        weights = None
        if self.use_sdpa and not return_weights:
            # Queries sit at positions past..past+T-1; keys at 0..past+T-1. One query at the
            # end of an unpadded cache sees every key: no mask at all (the fast decode step).
            mask, is_causal = attn_mask, False
            if mask is None and T > 1:  # (branches, not a bool expression: torch.compile
                if past > 0:            # with dynamic shapes needs a plain bool is_causal)
                    mask = _causal_mask(T, past, x.device)
                else:
                    is_causal = True
            p = self.attn_drop.p if self.training else 0.0
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p,
                                               is_causal=is_causal)
        else:
            allowed = attn_mask if attn_mask is not None else _causal_mask(T, past, x.device)
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)
            scores = scores.masked_fill(~allowed, float("-inf"))
            weights = torch.softmax(scores.float(), dim=-1).to(q.dtype)
            y = self.attn_drop(weights) @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y), weights


def _causal_mask(T: int, past: int, device: torch.device) -> torch.Tensor:
    """Boolean (T, past+T): query i (absolute position past+i) may see key j <= past+i."""
    q_pos = torch.arange(past, past + T, device=device)[:, None]
    k_pos = torch.arange(past + T, device=device)[None, :]
    return k_pos <= q_pos


def _padded_causal_mask(T: int, past: int, key_mask: torch.Tensor) -> torch.Tensor:
    """Boolean (B, 1, T, past+T): causal, and padding keys (key_mask False) hidden.

    A padding query would see no key at all (an all -inf row, NaN after softmax), so every
    query may always see itself; real queries never see a padding key, so what padding
    positions compute never reaches a real token.
    """
    causal = _causal_mask(T, past, key_mask.device)
    self_key = torch.arange(past + T, device=key_mask.device)[None, :] == \
        torch.arange(past, past + T, device=key_mask.device)[:, None]
    return (causal & key_mask[:, None, None, :past + T]) | self_key


ACTIVATIONS = {
    "gelu": lambda x: F.gelu(x),                        # x * Phi(x), Phi the normal CDF (erf)
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}


class FeedForward(nn.Module):
    """FFN(x) = act(x W_fc^T + b_fc) W_proj^T + b_proj."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.n_embd, cfg.ffn_dim, bias=cfg.bias)
        self.proj = nn.Linear(cfg.ffn_dim, cfg.n_embd, bias=cfg.bias)
        self.act = ACTIVATIONS[cfg.activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.act(self.fc(x)))


class Block(nn.Module):
    """Pre-norm block: x1 = x + Drop(Attn(LN1(x))); x2 = x1 + Drop(FFN(LN2(x1)))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.n_embd, eps=cfg.ln_eps)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.n_embd, eps=cfg.ln_eps)
        self.ffn = FeedForward(cfg)
        self.resid_drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None, layer: int = 0,
                return_weights: bool = False, attn_mask: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        a, weights = self.attn(self.ln1(x), cache, layer, return_weights, attn_mask)
        x = x + self.resid_drop(a)
        x = x + self.resid_drop(self.ffn(self.ln2(x)))
        return x, weights


class Head(nn.Module):
    """Output head: logits = x W^T + b, W its own (untied) or the token embedding (tied)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.weight = None if cfg.tie_weights else nn.Parameter(
            torch.empty(cfg.vocab_size, cfg.n_embd))
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size)) if cfg.head_bias else None

    def forward(self, x: torch.Tensor, tied_weight: torch.Tensor) -> torch.Tensor:
        w = tied_weight if self.weight is None else self.weight
        return F.linear(x, w, self.bias)


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.vocab_size < 1:
            raise ValueError("ModelConfig.vocab_size must be set (from the tokenizer)")
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        if cfg.pos_encoding == "learned":
            self.pos_emb = nn.Embedding(cfg.block_size, cfg.n_embd)
        else:
            table = sinusoidal_table(cfg.block_size, cfg.n_embd) * cfg.sinusoid_scale
            table = torch.from_numpy(table).float()
            self.register_buffer("pos_table", table, persistent=False)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, eps=cfg.ln_eps)
        self.head = Head(cfg)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """N(0, 0.02) weights, zero biases; residual projections N(0, 0.02 / sqrt(2 n_layer))."""
        residual_std = 0.02 / math.sqrt(2 * self.cfg.n_layer)
        for name, p in self.named_parameters():
            if name.endswith(("ln1.weight", "ln2.weight", "ln_f.weight")):
                nn.init.ones_(p)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
            elif name.endswith(("attn.proj.weight", "ffn.proj.weight")):
                nn.init.normal_(p, 0.0, residual_std)
            else:
                nn.init.normal_(p, 0.0, 0.02)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def positions(self, start: int, T: int) -> torch.Tensor:
        if self.cfg.pos_encoding == "learned":
            return self.pos_emb.weight[start:start + T]
        return self.pos_table[start:start + T]

    def positions_at(self, pos_ids: torch.Tensor) -> torch.Tensor:
        """The positional rows P[pos_ids] (B, T, d): each row of a left-padded batch counts
        its positions from its own first real token."""
        table = self.pos_emb.weight if self.cfg.pos_encoding == "learned" else self.pos_table
        return F.embedding(pos_ids, table)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None,
                cache: KVCache | None = None, last_only: bool = False,
                return_attention: bool = False, pos_ids: torch.Tensor | None = None,
                key_mask: torch.Tensor | None = None):
        """Logits (B, T, V) and the mean loss when targets are given.

        With a cache, `idx` continues the cached positions. `last_only` computes the head for the
        last position only (generation). `return_attention` also returns each layer's
        attention weights (B, H, T, T_keys) through the explicit path.

        Batches of prompts of different lengths (left padding): `pos_ids` (B, T) gives each
        token's position within its own row, and `key_mask` (B, >= cached + T) is True at real
        tokens and False at padding, which no real token then attends to.
        """
        B, T = idx.shape
        start = cache.length if cache is not None else 0
        if start + T > self.cfg.block_size:
            raise ValueError(f"sequence of {start + T} tokens exceeds block_size "
                             f"{self.cfg.block_size}")
        pos = self.positions(start, T) if pos_ids is None else self.positions_at(pos_ids)
        x = self.drop(self.tok_emb(idx) + pos)
        mask = None if key_mask is None else _padded_causal_mask(T, start, key_mask)
        attentions = []
        for i, block in enumerate(self.blocks):
            x, w = block(x, cache, i, return_attention, mask)
            attentions.append(w)
        if cache is not None:
            cache.advance(T)
        x = self.ln_f(x)
        if last_only:
            x = x[:, -1:, :]
        logits = self.head(x, self.tok_emb.weight)
        loss = cross_entropy(logits, targets) if targets is not None else None
        if return_attention:
            return logits, loss, attentions
        return logits, loss

    def new_cache(self, batch: int = 1, max_len: int | None = None) -> KVCache:
        p = self.tok_emb.weight
        return KVCache(self.cfg.n_layer, batch, self.cfg.n_head, max_len or self.cfg.block_size,
                       self.cfg.head_dim, p.device, p.dtype)

    def set_attention_path(self, sdpa: bool) -> None:
        for block in self.blocks:
            block.attn.use_sdpa = sdpa

    # The checkpoint format is NumPy float32, keyed by the shared parameter names.
    def numpy_weights(self) -> dict[str, np.ndarray]:
        return {name: p.detach().float().cpu().numpy() for name, p in self.named_parameters()}

    def load_numpy_weights(self, weights: dict[str, np.ndarray], where: str = "checkpoint"
                           ) -> None:
        params = dict(self.named_parameters())
        missing = sorted(set(params) - set(weights))
        unexpected = sorted(set(weights) - set(params))
        if missing or unexpected:
            raise UserError(f"{where} does not match the model config: missing {missing[:3]}, "
                            f"unexpected {unexpected[:3]}")
        with torch.no_grad():
            for name, p in params.items():
                w = weights[name]
                if tuple(w.shape) != tuple(p.shape):
                    raise UserError(f"{where}: {name} has shape {tuple(w.shape)}, the config "
                                    f"expects {tuple(p.shape)}")
                p.copy_(torch.from_numpy(np.asarray(w, dtype=np.float32)))

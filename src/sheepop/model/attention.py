"""Causal multi-head self-attention of the torch engine, with the shared KV cache.

    [Q; K; V] = X W_qkv^T + b_qkv,  H query heads and H_kv key/value heads of width d_k = d / H
    Y_h = softmax(Q_h K_g^T / sqrt(d_k) + M) V_g   per query head h, g = h // (H / H_kv),
                                                   M = -inf where a query may not see a key
    out = concat(heads) W_proj^T + b_proj

H_kv = H is multi-head attention; fewer is grouped-query attention (each key/value head serves
H / H_kv consecutive query heads), H_kv = 1 multi-query attention. The KV cache stores the H_kv
heads only.

Which keys a query may see (causal; padding hidden) is the shared rule
`sheepop.arch.batch.allowed_keys`; the NumPy engine's unit is sheepop/scratch/attention.py.
The mathematics (masking, GQA, the KV cache): docs/derivations/attention.md.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from sheepop.arch.batch import allowed_keys
from sheepop.arch.hooks import LayerHooks
from sheepop.arch.kv_cache import KVCache
from sheepop.arch.packed import Packed
from sheepop.config.schema import ModelConfig
from sheepop.model.positions import Pos, Positions
from sheepop.model.qk_norm import norm_and_turn
from sheepop.model.value_embeds import ValueMix, mix_values


def causal_mask(T: int, past: int, device: torch.device) -> torch.Tensor:
    """Boolean (T, past+T): query i (absolute position past+i) may see key j <= past+i."""
    return torch.from_numpy(allowed_keys(T, past)).to(device)


class CausalSelfAttention(nn.Module):
    """softmax(Q K^T / sqrt(d_k) + M) V per head, M = -inf above the diagonal; then W_proj."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = cfg.n_head, cfg.kv_heads, cfg.head_dim
        self.qkv = nn.Linear(cfg.n_embd, (cfg.n_head + 2 * cfg.kv_heads) * cfg.head_dim,
                             bias=cfg.bias)
        self.proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.attn_drop = nn.Dropout(cfg.dropout)
        self.use_sdpa = True  # False: the explicit masked-softmax path (same output)
        # model.qk_norm: each head's q and k RMS-normalised (no gain) before RoPE, so every
        # score lies within +-sqrt(d_k) (sheepop.scratch.qk_norm derives it; the torch unit
        # is sheepop.model.qk_norm)
        self.qk_norm_eps = cfg.ln_eps if cfg.qk_norm else None
        self.hooks: LayerHooks | None = None  # set for one pass by sheepop.model.hooks

    def forward(self, x: torch.Tensor, positions: Positions | None = None, pos: Pos = None,
                cache: KVCache | None = None, layer: int = 0,
                attn_mask: torch.Tensor | None = None, values: ValueMix | None = None
                ) -> torch.Tensor:
        """`attn_mask`: boolean (B, 1, T, T_keys), True where a query may see a key; None is
        the plain causal mask. `positions.rotate` turns the queries and keys (RoPE); `values`
        is this layer's value embedding (sheepop.model.value_embeds). Hooks (docs/hooks.md)
        that read the scores or the pattern take the explicit path, which forms them. A
        `Packed` cache: x (1, N, d) holds several sequences' tokens, each attending over its
        own cache under its own mask (sheepop.arch.packed)."""
        B, T, C = x.shape
        hooks = self.hooks
        q, k, v = self._queries_keys_values(x, positions, pos, values)
        if isinstance(cache, Packed):  # each sequence against its own cache (arch.packed)
            y = cache.attend(layer, q, k, v, self._attend, torch.cat)
        else:
            past = 0
            if cache is not None:
                past = cache.query_offset(T)
                k, v = cache.update(layer, k, v)
            y = self._attend(q, k, v, attn_mask, past)
        if hooks is not None:
            y = hooks.at("attn.heads", y)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y)

    def _queries_keys_values(self, x: torch.Tensor, positions: Positions | None, pos: Pos,
                             values: ValueMix | None
                             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q (B, H, T, d_k), k and v (B, H_kv, T, d_k): projected, QK-normed, turned, mixed."""
        B, T, _ = x.shape
        H, H_kv, d_k = self.n_head, self.n_kv_head, self.head_dim
        hooks = self.hooks
        heads = self.qkv(x).view(B, T, H + 2 * H_kv, d_k).transpose(1, 2)
        qk, v = heads.split((H + H_kv, H_kv), dim=1)
        if hooks is not None:
            qk = _hooked_projections(hooks, qk, H)
        # queries and keys normalise and turn by the same angles: one pass (qk_norm.py)
        qk = norm_and_turn(qk, self.qk_norm_eps, positions, pos)
        q, k = qk.split((H, H_kv), dim=1)
        if values is not None:  # before the cache stores them: later steps read them mixed
            v = mix_values(v, values)
        if hooks is not None:
            q, k, v = hooks.at("attn.q", q), hooks.at("attn.k", k), hooks.at("attn.v", v)
        return q, k, v

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                attn_mask: torch.Tensor | None, past: int) -> torch.Tensor:
        """Y (B, H, T, d_k): the fused kernel, or the explicit path where a hook reads the
        scores or the pattern."""
        hooks = self.hooks
        if self.use_sdpa and (hooks is None or not hooks.explicit_attention):
            return self._fused(q, k, v, attn_mask, past)
        return self._explicit(q, k, v, attn_mask, past)

    def _fused(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               attn_mask: torch.Tensor | None, past: int) -> torch.Tensor:
        """Y (B, H, T, d_k) by PyTorch's scaled_dot_product_attention (never forms S or A)."""
        B, H, T, d_k = q.shape
        H_kv = k.shape[1]
        # Queries sit at positions past..past+T-1; keys at 0..past+T-1. One query at the
        # end of an unpadded cache sees every key: no mask at all (the fast decode step).
        mask, is_causal = attn_mask, False
        if mask is None and T > 1:  # (branches, not a bool expression: torch.compile
            if past > 0:            # with dynamic shapes needs a plain bool is_causal)
                mask = causal_mask(T, past, q.device)
            else:
                is_causal = True
        p = self.attn_drop.p if self.training else 0.0
        if T == 1 and H_kv < H:
            # A decode step with grouped queries: the H / H_kv queries sharing a key/value
            # head are the rows of one attention over it (each sees every key, a padding
            # mask (B, 1, 1, T_keys) broadcasts over them), so no kernel has to expand the
            # groups (on CUDA, float32's grouped attention fell back to the math kernel:
            # ~10 launches a layer, half a SmolLM2 decode step's host time).
            y = F.scaled_dot_product_attention(q.reshape(B, H_kv, H // H_kv, d_k), k, v,
                                               attn_mask=mask, dropout_p=p)
            return y.reshape(B, H, 1, d_k)
        # bool(): under torch.compile's dynamic shapes H_kv < H is symbolic (a graph break
        # otherwise)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p,
                                              is_causal=is_causal, enable_gqa=bool(H_kv < H))

    def _explicit(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  attn_mask: torch.Tensor | None, past: int) -> torch.Tensor:
        """Y = Drop(softmax(S + M)) V with S = q K^T / sqrt(d_k) and A formed (their hook
        points: attn.scores, attn.pattern)."""
        H, T, H_kv, hooks = q.shape[1], q.shape[2], k.shape[1], self.hooks
        if H_kv < H:  # each key/value head, once per query head of its group
            k, v = (t.repeat_interleave(H // H_kv, dim=1) for t in (k, v))
        allowed = attn_mask if attn_mask is not None else causal_mask(T, past, q.device)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        if hooks is not None:
            scores = hooks.at("attn.scores", scores)
        scores = scores.masked_fill(~allowed, float("-inf"))
        # softmax in at least float32 (half precision is upcast), float64 kept whole
        wide = torch.promote_types(scores.dtype, torch.float32)
        weights = torch.softmax(scores.to(wide), dim=-1).to(q.dtype)
        if hooks is not None:
            weights = hooks.at("attn.pattern", weights)
        return self.attn_drop(weights) @ v


def _hooked_projections(hooks: LayerHooks, qk: torch.Tensor, n_head: int) -> torch.Tensor:
    """The queries and keys stacked on the head axis after the hooks at q_pre and k_pre."""
    q, k = qk[:, :n_head], qk[:, n_head:]
    new_q, new_k = hooks.at("attn.q_pre", q), hooks.at("attn.k_pre", k)
    return qk if new_q is q and new_k is k else torch.cat([new_q, new_k], dim=1)

"""Causal multi-head self-attention, forward and backward, with every gradient written out.

    [Q; K; V] = X Wqkv^T + bqkv                 X (B, T, d); H query heads and H_kv key/value
                                                heads, all of width d_k = d / H
    K, V <- each key/value head repeated for the H / H_kv query heads of its group
    S = Q K^T / sqrt(d_k) + M                   per head; M = -inf above the diagonal
    A = softmax(S)  (row-wise),  Ad = Drop(A)
    Y = Ad V,  heads concatenated,  out = Y Wproj^T + bproj

H_kv = H is multi-head attention, fewer grouped-query attention, 1 multi-query attention. The
repetition is a copy in the forward pass, so its backward is a sum: a shared key/value head
receives the gradients of every query head that read it (repeat_kv_forward / _backward).

With a KV cache (generation) the same function stores the new keys and values and attends over
all cached ones. n_head = 1 is the single-head model; heads are a batch axis (B, H, T, d_k) for
np.matmul, so no Python loop runs over heads or tokens. The derivation of each backward (the
mask, the grouped heads' sum, the KV cache) is in docs/derivations/attention.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache
from typing import Any, NamedTuple

import numpy as np

from sheepop.arch.batch import allowed_keys
from sheepop.arch.hooks import LayerHooks
from sheepop.arch.kv_cache import KVCache
from sheepop.arch.packed import Packed
from sheepop.config.schema import ModelConfig
from sheepop.scratch.hooks import at_copy, block
from sheepop.scratch.layers import (
    LinearCache,
    dropout_backward,
    dropout_forward,
    linear_forward,
    linear_grads,
)
from sheepop.scratch.value_embeds import ValueMix, value_mix_backward, value_mix_forward
from sheepop.softmax import softmax


@lru_cache(maxsize=64)
def causal_mask(T: int, past: int = 0) -> np.ndarray:
    """Additive mask (T, past + T): 0 where query i (position past + i) may see key j <= past + i,
    -inf elsewhere (the shared rule `sheepop.arch.batch.allowed_keys`). Read-only, shared
    between calls."""
    mask = additive(allowed_keys(T, past))
    mask.setflags(write=False)
    return mask


def additive(allowed: np.ndarray) -> np.ndarray:
    """A boolean "may see" mask as the additive M of softmax(S + M): 0 or -inf."""
    return np.where(allowed, 0.0, -np.inf).astype(np.float32)


def softmax_backward(da: np.ndarray, a: np.ndarray) -> np.ndarray:
    """dS_ij = A_ij * (dA_ij - sum_k dA_ik A_ik): the softmax Jacobian diag(a) - a a^T per row."""
    row = np.einsum("...j,...j->...", da, a)[..., None]
    ds = da - row
    ds *= a
    return ds


class CoreCache(NamedTuple):
    q: np.ndarray        # (B, H, T, d_k)
    k: np.ndarray
    v: np.ndarray
    a: np.ndarray        # softmax weights (B, H, T, T)
    drop: np.ndarray | None
    ad: np.ndarray       # dropped weights actually multiplied into V
    scale: float


def attention_core_forward(q: np.ndarray, k: np.ndarray, v: np.ndarray, dropout: float = 0.0,
                           rng: np.random.Generator | None = None, mask: np.ndarray | None = None,
                           causal: bool = True) -> tuple[np.ndarray, CoreCache]:
    """Y = Drop(softmax(Q K^T / sqrt(d_k) + M)) V for (B, H, T, d_k) queries, keys and values.

    M is the causal mask (queries are the last T of the keys' positions) unless an additive
    `mask` broadcastable to (B, H, T, T_keys) is given (batched generation with padding).
    One query (a decode step) sees every key: M = 0, and nothing is added; `causal=False`
    says the same of queries that are not consecutive positions (grouped_decode_forward's
    rows, every one a decode step's query)."""
    T, dk = q.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(dk)
    s = q @ np.swapaxes(k, -1, -2)
    s *= s.dtype.type(scale)
    hooks = block()  # (hooks that read S or A keep grouped queries out: see the caller)
    if hooks is not None and hooks.wants("attn.scores"):
        s = at_copy(hooks, "attn.scores", s)
    if mask is not None:
        s += mask
    elif causal and T > 1:
        s += causal_mask(T, k.shape[-2] - T)
    a = softmax(s, out=s)  # (in place: S is not kept, A is)
    if hooks is not None:
        a = hooks.at("attn.pattern", a)
    ad, drop = dropout_forward(a, dropout, rng)
    y = ad @ v
    return y, CoreCache(q, k, v, a, drop, ad, scale)


def attention_core_backward(dy: np.ndarray, cache: CoreCache
                            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """dV = Ad^T dY; dA = Drop'(dY V^T); dS = softmax'(dA); dQ = dS K / sqrt(d_k),
    dK = dS^T Q / sqrt(d_k). Masked entries have A = 0, so their dS is 0 without a second mask."""
    q, k, v, a, drop, ad, scale = cache
    dv = np.swapaxes(ad, -1, -2) @ dy
    dad = dy @ np.swapaxes(v, -1, -2)
    da = dropout_backward(dad, drop)
    ds = softmax_backward(da, a)
    ds *= ds.dtype.type(scale)
    dq = ds @ k
    dk = np.swapaxes(ds, -1, -2) @ q
    return dq, dk, dv


def split_heads(qkv: np.ndarray, n_head: int, n_kv_head: int | None = None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(B, T, (H + 2 H_kv) d_k) with columns [Q; K; V] -> views (no copy): queries
    (B, H, T, d_k), keys and values (B, H_kv, T, d_k); H_kv = H by default."""
    qk, v = split_qk_v(qkv, n_head, n_kv_head)
    return qk[:, :n_head], qk[:, n_head:], v


def split_qk_v(qkv: np.ndarray, n_head: int, n_kv_head: int | None = None
               ) -> tuple[np.ndarray, np.ndarray]:
    """The same split as views of queries and keys stacked on the head axis (B, H + H_kv, T,
    d_k), which RoPE turns together, and values (B, H_kv, T, d_k)."""
    n_kv_head = n_kv_head or n_head
    B, T, _ = qkv.shape
    heads = qkv.reshape(B, T, n_head + 2 * n_kv_head, -1).transpose(0, 2, 1, 3)
    return heads[:, :n_head + n_kv_head], heads[:, n_head + n_kv_head:]


def repeat_kv_forward(x: np.ndarray, groups: int) -> np.ndarray:
    """(B, H_kv, T, d_k) -> (B, H_kv * groups, T, d_k): head g serves query heads
    g*groups .. g*groups + groups-1 (a view-free copy only when groups > 1)."""
    return x if groups == 1 else np.repeat(x, groups, axis=1)


def repeat_kv_backward(dx: np.ndarray, groups: int) -> np.ndarray:
    """dK_g = sum over the query heads h of group g of dK_h: the adjoint of the copy."""
    if groups == 1:
        return dx
    B, H, T, dk = dx.shape
    return dx.reshape(B, H // groups, groups, T, dk).sum(axis=2)


def grouped_decode_forward(q: np.ndarray, k: np.ndarray, v: np.ndarray,
                           mask: np.ndarray | None = None) -> tuple[np.ndarray, CoreCache]:
    """One query per head (a decode step, q (B, H, 1, d_k)) against H_kv cached key/value heads
    (B, H_kv, T, d_k), without `repeat_kv_forward`'s copy of the cache to H heads: the
    H / H_kv queries sharing a key/value head (heads g*groups .. g*groups + groups-1) become the
    rows of one product, (B, H_kv, groups, d_k) against (B, H_kv, T, d_k). The same Y; a
    one-token query sees every key (the causal mask is all zeros), and a given `mask`
    ((T_keys,) rows, or (B, 1, 1, T_keys)) broadcasts over the groups. Inference only (no
    backward: its cache holds the grouped shapes)."""
    B, H, _, dk = q.shape
    grouped = q.reshape(B, k.shape[1], H // k.shape[1], dk)
    y, core = attention_core_forward(grouped, k, v, mask=mask, causal=False)
    return y.reshape(B, H, 1, dk), core


def merge_heads(y: np.ndarray) -> np.ndarray:
    """(B, H, T, d_k) -> (B, T, H * d_k): heads side by side, head h in columns h*d_k:(h+1)*d_k."""
    B, H, T, dk = y.shape
    return y.transpose(0, 2, 1, 3).reshape(B, T, H * dk)


class AttentionCache(NamedTuple):
    qkv: LinearCache
    core: CoreCache
    proj: LinearCache
    n_head: int
    n_kv_head: int
    rotate_backward: Callable | None
    rotation: Any
    values: Any = None   # value_mix_forward's cache (model.value_embeds), None without


Rotation = tuple[Callable, Callable]
"""A position kind acting on queries and keys (RoPE): forward(qk) -> (qk, cache) and
backward(dqk, cache) -> dqk, qk the queries and keys stacked on the head axis (`split_qk_v`),
the forward bound to the positions (sheepop.scratch.positions)."""


def self_attention_forward(x: np.ndarray, w_qkv: np.ndarray, b_qkv: np.ndarray | None,
                           w_proj: np.ndarray, b_proj: np.ndarray | None, n_head: int,
                           dropout: float = 0.0, rng: np.random.Generator | None = None,
                           cache: KVCache | None = None, layer: int = 0,
                           mask: np.ndarray | None = None, rotate: Rotation | None = None,
                           n_kv_head: int | None = None, values: ValueMix | None = None
                           ) -> tuple[np.ndarray, AttentionCache]:
    """out = merge(Drop(softmax(Q K^T / sqrt(d_k) + M)) V) Wproj^T + bproj, Q K V from X Wqkv^T.

    With a KV `cache` (inference), the new keys and values are stored in it at `layer` and the
    queries attend over every cached key; `mask` (additive, broadcastable to (B, H, T, T_keys))
    replaces the causal one (left-padded batches). `rotate` turns Q and K by their positions;
    `n_kv_head` (default n_head) key/value heads are shared by groups of query heads;
    `values` mixes value embeddings into the values (sheepop.scratch.value_embeds). A `Packed`
    cache: x (1, N, d) holds several sequences' tokens, each attending over its own cache under
    its own mask (sheepop.arch.packed)."""
    n_kv_head = n_kv_head or n_head
    hooks = block()
    qkv, qkv_cache = linear_forward(x, w_qkv, b_qkv)
    qk, v = split_qk_v(qkv, n_head, n_kv_head)
    if hooks is not None:
        qk = _hooked_projections(hooks, qk, n_head)
    mixed = None
    if values is not None:  # before the cache stores them: later steps read the mixed values
        v, mixed = value_mix_forward(v, values)
    rotation = None
    if rotate is not None:
        qk, rotation = rotate[0](qk)
    q, k = qk[:, :n_head], qk[:, n_head:]
    if hooks is not None:
        q, k, v = hooks.at("attn.q", q), hooks.at("attn.k", k), hooks.at("attn.v", v)
    groups, kept = n_head // n_kv_head, []

    def attend(q, k, v, mask, past=0):
        if cache is not None and groups > 1 and q.shape[2] == 1 and \
                _may_group(dropout, rng, hooks):
            y, core = grouped_decode_forward(q, k, v, mask)  # a decode step: no KV copy
        else:
            k, v = repeat_kv_forward(k, groups), repeat_kv_forward(v, groups)
            y, core = attention_core_forward(q, k, v, dropout, rng, mask)
        kept.append(core)
        return y

    if isinstance(cache, Packed):  # each sequence against its own cache (arch.packed)
        y = cache.attend(layer, q, k, v, attend, np.concatenate)
    else:
        if cache is not None:
            k, v = cache.update(layer, k, v)
        y = attend(q, k, v, mask)
    core_cache = kept[0] if len(kept) == 1 else None  # (packed: no backward through a cache)
    if hooks is not None:
        y = hooks.at("attn.heads", y)
    out, proj_cache = linear_forward(merge_heads(y), w_proj, b_proj)
    return out, AttentionCache(qkv_cache, core_cache, proj_cache, n_head, n_kv_head,
                               rotate[1] if rotate is not None else None, rotation, mixed)


def _may_group(dropout: float, rng: np.random.Generator | None, hooks: LayerHooks | None
               ) -> bool:
    """Whether a decode step may take `grouped_decode_forward`: no dropout drawn (inference), and
    no hook reads the scores or the pattern, which it forms in grouped shapes."""
    return (dropout == 0 or rng is None) and (hooks is None or not hooks.explicit_attention)


def _hooked_projections(hooks: LayerHooks, qk: np.ndarray, n_head: int) -> np.ndarray:
    """The queries and keys stacked (`split_qk_v`) after the hooks at q_pre and k_pre."""
    q, k = qk[:, :n_head], qk[:, n_head:]
    new_q, new_k = hooks.at("attn.q_pre", q), hooks.at("attn.k_pre", k)
    return qk if new_q is q and new_k is k else np.concatenate([new_q, new_k], axis=1)


def self_attention_backward(dout: np.ndarray, cache: AttentionCache,
                            gradients: LayerHooks | None = None
                            ) -> tuple[np.ndarray, dict[str, np.ndarray | None]]:
    """dx and the gradients {qkv.weight, qkv.bias, proj.weight, proj.bias} (None if absent);
    with value embeddings also "values": (dR, dlam) for sheepop.scratch.value_embeds.
    `gradients` reads the heads' gradient dL/do_h (attn.heads; sheepop.scratch.block)."""
    dmerged, grads = linear_grads(dout, cache.proj, "proj")
    B, T, d = dmerged.shape
    H, H_kv = cache.n_head, cache.n_kv_head
    dy = dmerged.reshape(B, T, H, d // H).transpose(0, 2, 1, 3)
    if gradients is not None:
        dy = gradients.at("attn.heads", dy)
    dq, dk, dv = attention_core_backward(dy, cache.core)
    dk, dv = repeat_kv_backward(dk, H // H_kv), repeat_kv_backward(dv, H // H_kv)
    if cache.values is not None:
        dv, grads["values"] = value_mix_backward(dv, cache.values)
    # Write the three gradients straight into one (B, T, (H + 2 H_kv) d_k) buffer laid out as
    # [Q; K; V], the rotation's adjoint then applied to the queries' and keys' part at once.
    dqkv = np.empty((B, T, (H + 2 * H_kv) * (d // H)), dtype=dout.dtype)
    dq_view, dk_view, dv_view = split_heads(dqkv, H, H_kv)
    dq_view[...] = dq
    dk_view[...] = dk
    dv_view[...] = dv
    if cache.rotate_backward is not None:
        dqk_view = split_qk_v(dqkv, H, H_kv)[0]
        dqk_view[...] = cache.rotate_backward(dqk_view, cache.rotation)
    dx, qkv_grads = linear_grads(dqkv, cache.qkv, "qkv")
    return dx, {**qkv_grads, **grads}


def attention_params(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The attention's parameters under the block's `attn.` prefix (biases when cfg.bias)."""
    d, width = cfg.n_embd, (cfg.n_head + 2 * cfg.kv_heads) * cfg.head_dim
    shapes = {"qkv.weight": (width, d), "qkv.bias": (width,), "proj.weight": (d, d),
              "proj.bias": (d,)}
    return {k: v for k, v in shapes.items() if cfg.bias or k.endswith("weight")}

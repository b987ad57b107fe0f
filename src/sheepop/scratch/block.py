"""The feed-forward network and the pre-norm transformer block, forward and backward.

    FFN(x) = act(x Wfc^T + bfc) Wproj^T + bproj
    x1 = x + Drop(Attn(LN1(x)))
    x2 = x1 + Drop(FFN(LN2(x1)))

A residual connection copies its input to two places, so in the backward pass the two
gradients arriving there add up: dx = dx1 + dAttn-path(dx1), dx1 = dx2 + dFFN-path(dx2).
Parameters are read from the flat parameter dict under the block's prefix ("blocks.{i}.").
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from sheepop.config import ModelConfig
from sheepop.scratch.attention import self_attention_backward, self_attention_forward
from sheepop.scratch.layers import (
    ACTIVATIONS,
    LinearCache,
    dropout_backward,
    dropout_forward,
    layernorm_backward,
    layernorm_forward,
    linear_backward,
    linear_forward,
)

Params = dict[str, np.ndarray]


class FFNCache(NamedTuple):
    fc: LinearCache
    act: Any
    proj: LinearCache
    activation: str


def ffn_forward(x: np.ndarray, w_fc: np.ndarray, b_fc: np.ndarray | None, w_proj: np.ndarray,
                b_proj: np.ndarray | None, activation: str) -> tuple[np.ndarray, FFNCache]:
    """FFN(x) = act(x Wfc^T + bfc) Wproj^T + bproj, act one of gelu | gelu_tanh | relu."""
    h, fc_cache = linear_forward(x, w_fc, b_fc)
    a, act_cache = ACTIVATIONS[activation][0](h)
    del h  # GELU keeps x and Phi(x); ReLU only its mask
    out, proj_cache = linear_forward(a, w_proj, b_proj)
    return out, FFNCache(fc_cache, act_cache, proj_cache, activation)


def ffn_backward(dout: np.ndarray, cache: FFNCache) -> tuple[np.ndarray, Params]:
    """Back through the output projection, the activation and the first linear layer."""
    da, dw_proj, db_proj = linear_backward(dout, cache.proj)
    dh = ACTIVATIONS[cache.activation][1](da, cache.act)
    dx, dw_fc, db_fc = linear_backward(dh, cache.fc)
    return dx, {"fc.weight": dw_fc, "fc.bias": db_fc, "proj.weight": dw_proj,
                "proj.bias": db_proj}


class BlockCache(NamedTuple):
    ln1: Any
    attn: Any
    drop1: np.ndarray | None
    ln2: Any
    ffn: FFNCache
    drop2: np.ndarray | None


def block_forward(x: np.ndarray, params: Params, prefix: str, cfg: ModelConfig,
                  rng: np.random.Generator | None = None) -> tuple[np.ndarray, BlockCache]:
    """x2 = x1 + Drop(FFN(LN2(x1))), x1 = x + Drop(Attn(LN1(x))). Dropout only with an rng."""
    p = lambda name: params.get(prefix + name)  # noqa: E731 - absent biases read as None
    a_in, ln1 = layernorm_forward(x, p("ln1.weight"), p("ln1.bias"), cfg.ln_eps)
    a, attn = self_attention_forward(a_in, p("attn.qkv.weight"), p("attn.qkv.bias"),
                                     p("attn.proj.weight"), p("attn.proj.bias"), cfg.n_head,
                                     cfg.dropout, rng)
    a, drop1 = dropout_forward(a, cfg.dropout, rng)
    x1 = x + a
    f_in, ln2 = layernorm_forward(x1, p("ln2.weight"), p("ln2.bias"), cfg.ln_eps)
    f, ffn = ffn_forward(f_in, p("ffn.fc.weight"), p("ffn.fc.bias"), p("ffn.proj.weight"),
                         p("ffn.proj.bias"), cfg.activation)
    f, drop2 = dropout_forward(f, cfg.dropout, rng)
    f += x1
    return f, BlockCache(ln1, attn, drop1, ln2, ffn, drop2)


def block_backward(dout: np.ndarray, cache: BlockCache, prefix: str
                   ) -> tuple[np.ndarray, dict[str, np.ndarray | None]]:
    """dx1 = dx2 + LN2'(FFN'(Drop'(dx2))); dx = dx1 + LN1'(Attn'(Drop'(dx1))).

    Returns dx and the block's gradients keyed by full parameter name (None for absent biases).
    """
    grads: dict[str, np.ndarray | None] = {}
    df = dropout_backward(dout, cache.drop2)
    df_in, ffn_grads = ffn_backward(df, cache.ffn)
    dx1, grads[prefix + "ln2.weight"], grads[prefix + "ln2.bias"] = layernorm_backward(
        df_in, cache.ln2)
    dx1 += dout
    da = dropout_backward(dx1, cache.drop1)
    da_in, attn_grads = self_attention_backward(da, cache.attn)
    dx, grads[prefix + "ln1.weight"], grads[prefix + "ln1.bias"] = layernorm_backward(
        da_in, cache.ln1)
    dx += dx1
    grads.update({f"{prefix}ffn.{k}": v for k, v in ffn_grads.items()})
    grads.update({f"{prefix}attn.{k}": v for k, v in attn_grads.items()})
    return dx, grads

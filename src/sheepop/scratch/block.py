"""The pre-norm transformer block, forward and backward.

    x1 = x + Drop(Attn(Norm1(x)))
    x2 = x1 + Drop(FFN(Norm2(x1)))

The norm, the attention and the feed-forward network are the units the config chooses
(norm.py, attention.py, ffn.py). A residual connection copies its input to two places, so in the
backward pass the two gradients arriving there add up: dx = dx1 + dAttn-path(dx1),
dx1 = dx2 + dFFN-path(dx2). Parameters are read from the flat parameter dict under the block's
prefix ("blocks.{i}.").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from sheepop.arch.hooks import LayerHooks
from sheepop.arch.kv_cache import KVCache
from sheepop.config.schema import ModelConfig
from sheepop.scratch.attention import (
    Rotation,
    self_attention_backward,
    self_attention_forward,
)
from sheepop.scratch.ffn import FFNS
from sheepop.scratch.hooks import enter_block
from sheepop.scratch.layers import dropout_backward, dropout_forward
from sheepop.scratch.norm import norm_backward, norm_forward
from sheepop.scratch.value_embeds import ValueMix

Params = dict[str, np.ndarray]


def param_lookup(params: Params, prefix: str) -> Callable[[str], np.ndarray | None]:
    """name -> params[prefix + name], None when absent (a bias the config leaves out)."""
    return lambda name: params.get(prefix + name)


class BlockCache(NamedTuple):
    ln1: Any
    attn: Any
    drop1: np.ndarray | None
    ln2: Any
    ffn: Any
    drop2: np.ndarray | None
    cfg: ModelConfig


def block_forward(x: np.ndarray, params: Params, prefix: str, cfg: ModelConfig,
                  rng: np.random.Generator | None = None, cache: KVCache | None = None,
                  layer: int = 0, mask: np.ndarray | None = None,
                  rotate: Rotation | None = None, values: ValueMix | None = None
                  ) -> tuple[np.ndarray, BlockCache]:
    """x2 = x1 + Drop(FFN(Norm2(x1))), x1 = x + Drop(Attn(Norm1(x))). Dropout only with an rng;
    `cache`, `layer`, `mask`, `rotate` and `values` go to the attention
    (self_attention_forward)."""
    p = param_lookup(params, prefix)
    hooks = enter_block(layer)  # (None without hooks: every `if` below then skips)
    if hooks is not None:
        x = hooks.at("resid_in", x)
    a_in, ln1 = norm_forward(cfg.norm, x, params, prefix + "ln1.", cfg.ln_eps)
    if hooks is not None:
        a_in = hooks.at("ln1", a_in)
    a, attn = self_attention_forward(a_in, p("attn.qkv.weight"), p("attn.qkv.bias"),
                                     p("attn.proj.weight"), p("attn.proj.bias"), cfg.n_head,
                                     cfg.dropout, rng, cache, layer, mask, rotate,
                                     cfg.kv_heads, values)
    if hooks is not None:
        a = hooks.at("attn.out", a)
    a, drop1 = dropout_forward(a, cfg.dropout, rng)
    x1 = x + a
    if hooks is not None:
        x1 = hooks.at("resid_mid", x1)
    f_in, ln2 = norm_forward(cfg.norm, x1, params, prefix + "ln2.", cfg.ln_eps)
    if hooks is not None:
        f_in = hooks.at("ln2", f_in)
    f, ffn = FFNS[cfg.ffn].forward(f_in, lambda name: p("ffn." + name), cfg)
    if hooks is not None:  # (a new sum: a hook may have kept f, which `+=` would change)
        f = hooks.at("ffn.out", f)
        f, drop2 = dropout_forward(f, cfg.dropout, rng)
        return hooks.at("resid_out", x1 + f), BlockCache(ln1, attn, drop1, ln2, ffn, drop2, cfg)
    f, drop2 = dropout_forward(f, cfg.dropout, rng)
    f += x1
    return f, BlockCache(ln1, attn, drop1, ln2, ffn, drop2, cfg)


def block_backward(dout: np.ndarray, cache: BlockCache, prefix: str,
                   gradients: LayerHooks | None = None
                   ) -> tuple[np.ndarray, dict[str, np.ndarray | None]]:
    """dx1 = dx2 + Norm2'(FFN'(Drop'(dx2))); dx = dx1 + Norm1'(Attn'(Drop'(dx1))).

    Returns dx and the block's gradients keyed by full parameter name (None for absent
    biases). `gradients` reads the gradient at the block's points as it passes them
    (dx2 at resid_out, Drop'(dx2) at ffn.out, dx1 at resid_mid, Drop'(dx1) at attn.out, the
    heads' in the attention, dx at resid_in; sheepop.scratch.gpt.gpt_backward).
    """
    cfg, at = cache.cfg, gradients
    if at is not None:
        dout = at.at("resid_out", dout)
    df = dropout_backward(dout, cache.drop2)
    if at is not None:
        df = at.at("ffn.out", df)
    df_in, ffn_grads = FFNS[cfg.ffn].backward(df, cache.ffn)
    dx1, grads = norm_backward(cfg.norm, df_in, cache.ln2, prefix + "ln2.")
    dx1 += dout
    if at is not None:
        dx1 = at.at("resid_mid", dx1)
    da = dropout_backward(dx1, cache.drop1)
    if at is not None:
        da = at.at("attn.out", da)
    da_in, attn_grads = self_attention_backward(da, cache.attn, at)
    dx, ln1_grads = norm_backward(cfg.norm, da_in, cache.ln1, prefix + "ln1.")
    dx += dx1
    if at is not None:
        dx = at.at("resid_in", dx)
    grads.update(ln1_grads)
    grads.update({f"{prefix}ffn.{k}": v for k, v in ffn_grads.items()})
    grads.update({f"{prefix}attn.{k}": v for k, v in attn_grads.items()})
    return dx, grads

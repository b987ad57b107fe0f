"""Feed-forward networks of the NumPy engine, one per `model.ffn` kind, forward and backward.

    mlp      FFN(x) = act(x Wfc^T + bfc) Wproj^T + bproj,   act = model.activation
    swiglu   FFN(x) = (silu(x Wgate^T + bgate) * (x Wup^T + bup)) Wproj^T + bproj

An `FFNKind` names its parameters (relative to the block's `ffn.` prefix) and its
forward(x, params, cfg) / backward(dout, cache) pair. The torch engine's units are in
sheepop/model/ffn.py; the derivations in docs/derivations/mlp.md (GELU MLP) and
docs/derivations/swiglu.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from sheepop.config.schema import ModelConfig
from sheepop.scratch.hooks import block
from sheepop.scratch.layers import (
    ACTIVATIONS,
    LinearCache,
    linear_forward,
    linear_grads,
    silu_backward,
    silu_forward,
)

Params = dict[str, np.ndarray]


class FFNCache(NamedTuple):
    fc: LinearCache
    act: Any
    proj: LinearCache
    activation: str


def ffn_forward(x: np.ndarray, w_fc: np.ndarray, b_fc: np.ndarray | None, w_proj: np.ndarray,
                b_proj: np.ndarray | None, activation: str) -> tuple[np.ndarray, FFNCache]:
    """FFN(x) = act(x Wfc^T + bfc) Wproj^T + bproj, act one of gelu | gelu_tanh | relu |
    relu2."""
    hooks = block()
    h, fc_cache = linear_forward(x, w_fc, b_fc)
    if hooks is not None:
        h = hooks.at("ffn.pre", h)
    a, act_cache = ACTIVATIONS[activation][0](h)
    del h  # GELU keeps x and Phi(x); ReLU only its mask
    if hooks is not None:
        a = hooks.at("ffn.hidden", a)
    out, proj_cache = linear_forward(a, w_proj, b_proj)
    return out, FFNCache(fc_cache, act_cache, proj_cache, activation)


def ffn_backward(dout: np.ndarray, cache: FFNCache) -> tuple[np.ndarray, Params]:
    """Back through the output projection, the activation and the first linear layer."""
    da, grads = linear_grads(dout, cache.proj, "proj")
    dh = ACTIVATIONS[cache.activation][1](da, cache.act)
    dx, fc_grads = linear_grads(dh, cache.fc, "fc")
    return dx, {**fc_grads, **grads}


def mlp_params(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    d, f = cfg.n_embd, cfg.ffn_dim
    shapes = {"fc.weight": (f, d), "fc.bias": (f,), "proj.weight": (d, f), "proj.bias": (d,)}
    return {k: v for k, v in shapes.items() if cfg.bias or k.endswith("weight")}


class SwiGLUCache(NamedTuple):
    gate: LinearCache
    up: LinearCache
    silu: Any
    a: np.ndarray        # silu(g)
    u: np.ndarray        # the up projection
    proj: LinearCache


def swiglu_forward(x: np.ndarray, w_gate: np.ndarray, b_gate: np.ndarray | None,
                   w_up: np.ndarray, b_up: np.ndarray | None, w_proj: np.ndarray,
                   b_proj: np.ndarray | None) -> tuple[np.ndarray, SwiGLUCache]:
    """FFN(x) = (silu(g) * u) Wproj^T + bproj, g = x Wgate^T + bgate, u = x Wup^T + bup:
    the gate decides, per hidden unit, how much of u goes through."""
    hooks = block()
    g, gate_cache = linear_forward(x, w_gate, b_gate)
    u, up_cache = linear_forward(x, w_up, b_up)
    if hooks is not None:
        g, u = hooks.at("ffn.pre", g), hooks.at("ffn.up", u)
    a, silu_cache = silu_forward(g)
    hidden = a * u
    if hooks is not None:
        hidden = hooks.at("ffn.hidden", hidden)
    out, proj_cache = linear_forward(hidden, w_proj, b_proj)
    return out, SwiGLUCache(gate_cache, up_cache, silu_cache, a, u, proj_cache)


def swiglu_backward(dout: np.ndarray, cache: SwiGLUCache) -> tuple[np.ndarray, Params]:
    """dh = dout Wproj; the product rule splits it: da = dh * u, du = dh * silu(g);
    dg = silu'(g) da; x fed both projections, so dx = dg Wgate + du Wup."""
    dh, grads = linear_grads(dout, cache.proj, "proj")
    dg = silu_backward(dh * cache.u, cache.silu)
    dx, gate_grads = linear_grads(dg, cache.gate, "gate")
    dx_up, up_grads = linear_grads(dh * cache.a, cache.up, "up")
    dx += dx_up
    return dx, {**gate_grads, **up_grads, **grads}


def swiglu_params(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    d, f = cfg.n_embd, cfg.ffn_dim
    shapes = {"gate.weight": (f, d), "gate.bias": (f,), "up.weight": (f, d), "up.bias": (f,),
              "proj.weight": (d, f), "proj.bias": (d,)}
    return {k: v for k, v in shapes.items() if cfg.bias or k.endswith("weight")}


class FFNKind(NamedTuple):
    params: Callable[[ModelConfig], dict[str, tuple[int, ...]]]
    forward: Callable[[np.ndarray, Callable[[str], Any], ModelConfig], tuple[np.ndarray, Any]]
    backward: Callable[[np.ndarray, Any], tuple[np.ndarray, Params]]


FFNS = {
    "mlp": FFNKind(mlp_params,
                   lambda x, p, cfg: ffn_forward(x, p("fc.weight"), p("fc.bias"),
                                                 p("proj.weight"), p("proj.bias"),
                                                 cfg.activation),
                   ffn_backward),
    "swiglu": FFNKind(swiglu_params,
                      lambda x, p, cfg: swiglu_forward(x, p("gate.weight"), p("gate.bias"),
                                                       p("up.weight"), p("up.bias"),
                                                       p("proj.weight"), p("proj.bias")),
                      swiglu_backward),
}

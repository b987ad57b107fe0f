"""Feed-forward networks of the NumPy engine, one per `model.ffn` kind, forward and backward.

    mlp   FFN(x) = act(x Wfc^T + bfc) Wproj^T + bproj,   act = model.activation

An `FFNKind` names its parameters (relative to the block's `ffn.` prefix) and its
forward(x, params, cfg) / backward(dout, cache) pair. The torch engine's units are in
sheepop/model/ffn.py; the derivations in docs/backprop.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from sheepop.config import ModelConfig
from sheepop.scratch.layers import ACTIVATIONS, LinearCache, linear_backward, linear_forward

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


def mlp_params(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    d, f = cfg.n_embd, cfg.ffn_dim
    shapes = {"fc.weight": (f, d), "fc.bias": (f,), "proj.weight": (d, f), "proj.bias": (d,)}
    return {k: v for k, v in shapes.items() if cfg.bias or k.endswith("weight")}


class FFNKind(NamedTuple):
    params: Callable[[ModelConfig], dict[str, tuple[int, ...]]]
    forward: Callable[[np.ndarray, Callable[[str], Any], ModelConfig], tuple[np.ndarray, Any]]
    backward: Callable[[np.ndarray, Any], tuple[np.ndarray, Params]]


FFNS = {
    "mlp": FFNKind(mlp_params,
                   lambda x, p, cfg: ffn_forward(x, p("fc.weight"), p("fc.bias"),
                                                 p("proj.weight"), p("proj.bias"), cfg.activation),
                   ffn_backward),
}

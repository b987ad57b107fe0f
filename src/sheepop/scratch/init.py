"""Parameter names, shapes and initialisation of the NumPy engine (docs/architecture.md).

The names and shapes are assembled from the layer kinds the config chooses (each unit names its
own parameters: positions.py, norm.py, attention.py, ffn.py), so a new kind declares its
parameters in its own file. Values follow the shared rule `sheepop.arch.params.init_rule`
(gains 1, biases 0, weights N(0, 0.02), residual projections N(0, 0.02 / sqrt(2 n_layer))).
"""

from __future__ import annotations

import numpy as np

from sheepop.arch.links import link_shapes
from sheepop.arch.params import check_shapes, init_rule
from sheepop.config.schema import ModelConfig
from sheepop.scratch.attention import attention_params
from sheepop.scratch.ffn import FFNS
from sheepop.scratch.norm import NORMS
from sheepop.scratch.positions import position_params


def param_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The parameters of the model in a fixed order, named exactly as in the torch engine."""
    d, V = cfg.n_embd, cfg.vocab_size
    norm = {name: (d,) for name in NORMS[cfg.norm].params}
    shapes: dict[str, tuple[int, ...]] = {"tok_emb.weight": (V, d)}
    shapes.update(position_params(cfg))
    for i in range(cfg.n_layer):
        b = f"blocks.{i}."
        shapes.update({f"{b}ln1.{k}": s for k, s in norm.items()})
        shapes.update({f"{b}attn.{k}": s for k, s in attention_params(cfg).items()})
        shapes.update({f"{b}ln2.{k}": s for k, s in norm.items()})
        shapes.update({f"{b}ffn.{k}": s for k, s in FFNS[cfg.ffn].params(cfg).items()})
    shapes.update({f"ln_f.{k}": s for k, s in norm.items()})
    if not cfg.tie_weights:
        shapes["head.weight"] = (V, d)
    if cfg.head_bias:
        shapes["head.bias"] = (V,)
    shapes.update(link_shapes(cfg))  # value embeddings, skip weights (sheepop.arch.links)
    return shapes


def check_weights(cfg: ModelConfig, weights: dict[str, np.ndarray], where: str = "checkpoint"
                  ) -> list[str]:
    """The parameter names of `cfg`, after checking that `weights` has exactly these, each of
    its shape (one clear UserError otherwise)."""
    shapes = param_shapes(cfg)
    check_shapes({name: np.shape(w) for name, w in weights.items()}, shapes, where)
    return list(shapes)


def init_params(cfg: ModelConfig, seed: int = 0, dtype: type = np.float32
                ) -> dict[str, np.ndarray]:
    """Fresh parameters by the shared rule, drawn from numpy.random.default_rng(seed)."""
    if cfg.vocab_size < 1:
        raise ValueError("ModelConfig.vocab_size must be set (from the tokenizer)")
    rng = np.random.default_rng(seed)
    params = {}
    for name, shape in param_shapes(cfg).items():
        kind, std = init_rule(name, cfg.n_layer, cfg.zero_init_proj)
        if kind == "ones":
            value = np.ones(shape)
        elif kind == "zeros":
            value = np.zeros(shape)
        elif kind == "fill":
            value = np.full(shape, std)
        else:
            value = rng.normal(0.0, std, shape)
        params[name] = value.astype(dtype)
    return params

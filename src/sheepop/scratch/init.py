"""Parameter names, shapes and initialisation (docs/architecture.md, the shared contract).

Every linear and embedding weight ~ N(0, 0.02), biases 0, LayerNorm gain 1 and shift 0; the two
residual projections (attn.proj, ffn.proj) ~ N(0, 0.02 / sqrt(2 n_layer)), so the variance of the
residual stream does not grow with depth (each block adds two such branches).
"""

from __future__ import annotations

import math

import numpy as np

from sheepop.config import ModelConfig


def param_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The parameters of the model in a fixed order, named exactly as in the torch engine."""
    d, V, f = cfg.n_embd, cfg.vocab_size, cfg.ffn_dim
    shapes: dict[str, tuple[int, ...]] = {"tok_emb.weight": (V, d)}
    if cfg.pos_encoding == "learned":
        shapes["pos_emb.weight"] = (cfg.block_size, d)
    for i in range(cfg.n_layer):
        b = f"blocks.{i}."
        layer = {
            "ln1.weight": (d,), "ln1.bias": (d,),
            "attn.qkv.weight": (3 * d, d), "attn.qkv.bias": (3 * d,),
            "attn.proj.weight": (d, d), "attn.proj.bias": (d,),
            "ln2.weight": (d,), "ln2.bias": (d,),
            "ffn.fc.weight": (f, d), "ffn.fc.bias": (f,),
            "ffn.proj.weight": (d, f), "ffn.proj.bias": (d,),
        }
        for name, shape in layer.items():
            if cfg.bias or not name.startswith(("attn.", "ffn.")) or name.endswith("weight"):
                shapes[b + name] = shape
    shapes["ln_f.weight"] = (d,)
    shapes["ln_f.bias"] = (d,)
    if not cfg.tie_weights:
        shapes["head.weight"] = (V, d)
    if cfg.head_bias:
        shapes["head.bias"] = (V,)
    return shapes


def init_params(cfg: ModelConfig, seed: int = 0, dtype: type = np.float32
                ) -> dict[str, np.ndarray]:
    """Fresh parameters by the rule above, drawn from numpy.random.default_rng(seed)."""
    if cfg.vocab_size < 1:
        raise ValueError("ModelConfig.vocab_size must be set (from the tokenizer)")
    rng = np.random.default_rng(seed)
    residual_std = 0.02 / math.sqrt(2 * cfg.n_layer)
    params = {}
    for name, shape in param_shapes(cfg).items():
        if name.endswith(("ln1.weight", "ln2.weight", "ln_f.weight")):
            value = np.ones(shape)
        elif name.endswith("bias"):
            value = np.zeros(shape)
        elif name.endswith(("attn.proj.weight", "ffn.proj.weight")):
            value = rng.normal(0.0, residual_std, shape)
        else:
            value = rng.normal(0.0, 0.02, shape)
        params[name] = value.astype(dtype)
    return params


def decays(name: str, value: np.ndarray) -> bool:
    """AdamW parameter groups (as the torch engine): weight decay on tensors with ndim >= 2 only
    (matrices and embeddings), never on biases or LayerNorm gains and shifts."""
    return value.ndim >= 2

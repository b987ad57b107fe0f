"""The whole GPT in NumPy: forward, hand-written backward, and the loss.

    h0 = Drop(E[x] + P[start:start+T])          P: s * sinusoidal table or pos_emb.weight
    h  = block_i(h)                             i = 0 .. n_layer-1 (see block.py)
    logits = LN_f(h) W_head^T (+ b_head)        W_head = E when the head is tied
    L = mean cross-entropy over targets != -1

The backward pass runs the same chain in reverse; with a tied head the embedding table receives
two gradients (the lookup's scatter-add and the head's dW), which add up. `gpt_forward` /
`gpt_backward` are plain functions over a parameter dict (the checkpoint's names); `GPT` holds
the parameters, preallocated gradient buffers and the forward cache between the two calls.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, NamedTuple

import numpy as np

from sheepop.config import ModelConfig
from sheepop.errors import UserError
from sheepop.positional import sinusoidal_table
from sheepop.scratch.block import block_backward, block_forward
from sheepop.scratch.init import init_params, param_shapes
from sheepop.scratch.layers import (
    CrossEntropyCache,
    cross_entropy_backward,
    cross_entropy_forward,
    dropout_backward,
    dropout_forward,
    embedding_backward,
    embedding_forward,
    layernorm_backward,
    layernorm_forward,
    learned_positions_backward,
    learned_positions_forward,
    linear_backward,
    linear_forward,
)

Params = dict[str, np.ndarray]


@lru_cache(maxsize=8)
def sinusoidal(n_positions: int, d: int, scale: float, dtype: str) -> np.ndarray:
    """s * P, P the shared sinusoidal table (sheepop.positional), in the model's dtype, computed
    once. s = cfg.sinusoid_scale (1/sqrt(d) by default, so the table does not drown the
    N(0, 0.02) token embeddings)."""
    table = (sinusoidal_table(n_positions, d) * scale).astype(dtype)
    table.setflags(write=False)
    return table


def head_weight(params: Params) -> np.ndarray:
    """W_head: its own matrix, or the token embedding when tied (no head.weight stored)."""
    return params.get("head.weight", params["tok_emb.weight"])


def positions(params: Params, cfg: ModelConfig, start: int, T: int, dtype: np.dtype
              ) -> tuple[np.ndarray, Any]:
    """P[start:start+T] and the learned table's cache (None for the sinusoidal table)."""
    if start + T > cfg.block_size:
        raise ValueError(f"sequence of {start + T} tokens exceeds block_size {cfg.block_size}")
    if cfg.pos_encoding == "learned":
        return learned_positions_forward(params["pos_emb.weight"], start, T)
    table = sinusoidal(cfg.block_size, cfg.n_embd, cfg.sinusoid_scale, np.dtype(dtype).name)
    return table[start:start + T], None


class GPTCache(NamedTuple):
    emb: Any
    pos: Any
    drop: np.ndarray | None
    blocks: list
    ln_f: Any
    head: Any
    tied: bool
    loss: CrossEntropyCache | None


def gpt_forward(params: Params, cfg: ModelConfig, idx: np.ndarray,
                targets: np.ndarray | None = None, rng: np.random.Generator | None = None
                ) -> tuple[np.ndarray, float | None, GPTCache]:
    """Logits (B, T, V), the mean loss (None without targets) and the cache for the backward.

    Dropout is applied only when an `rng` is given (training); without one this is evaluation.
    """
    idx = np.asarray(idx)
    T = idx.shape[-1]
    tok = params["tok_emb.weight"]
    h, emb = embedding_forward(idx, tok)
    pos_values, pos = positions(params, cfg, 0, T, tok.dtype)
    h += pos_values
    h, drop = dropout_forward(h, cfg.dropout, rng)
    blocks = []
    for i in range(cfg.n_layer):
        h, block_cache = block_forward(h, params, f"blocks.{i}.", cfg, rng)
        blocks.append(block_cache)
    h, ln_f = layernorm_forward(h, params["ln_f.weight"], params["ln_f.bias"], cfg.ln_eps)
    logits, head = linear_forward(h, head_weight(params), params.get("head.bias"))
    loss, loss_cache = (None, None) if targets is None else cross_entropy_forward(
        logits, np.asarray(targets))
    tied = "head.weight" not in params
    return logits, loss, GPTCache(emb, pos, drop, blocks, ln_f, head, tied, loss_cache)


def gpt_backward(cache: GPTCache, grads: Params | None = None, dloss: float = 1.0,
                 dlogits: np.ndarray | None = None) -> Params:
    """dL/d(every parameter) by the chain rule, from dL/dlogits (the loss's, scaled by `dloss`,
    unless `dlogits` is given). Gradients are *added* into `grads` when given (accumulation over
    micro-batches into preallocated buffers); otherwise a new dict is returned."""
    new: dict[str, np.ndarray | None] = {}
    if dlogits is None:
        if cache.loss is None:
            raise ValueError("gpt_backward needs a forward with targets, or dlogits")
        dlogits = cross_entropy_backward(dloss, cache.loss)
    dh, dw_head, new["head.bias"] = linear_backward(dlogits, cache.head)
    dh, new["ln_f.weight"], new["ln_f.bias"] = layernorm_backward(dh, cache.ln_f)
    for i in reversed(range(len(cache.blocks))):
        dh, block_grads = block_backward(dh, cache.blocks[i], f"blocks.{i}.")
        new.update(block_grads)
    dh = dropout_backward(dh, cache.drop)
    if cache.pos is not None:
        new["pos_emb.weight"] = learned_positions_backward(dh, cache.pos)
    new["tok_emb.weight"] = embedding_backward(dh, cache.emb)
    # The head's weight gradient belongs to the embedding table when the two are tied.
    if cache.tied:
        new["tok_emb.weight"] += dw_head
    else:
        new["head.weight"] = dw_head
    if grads is None:
        return {k: v for k, v in new.items() if v is not None}
    for name, g in new.items():
        if g is not None:
            grads[name] += g
    return grads



class GPT:
    """The NumPy GPT: parameters (float32 or float64), gradient buffers reused across steps."""

    def __init__(self, cfg: ModelConfig, params: Params | None = None,
                 dtype: type | str = np.float32, seed: int = 0):
        self.cfg = cfg
        self.dtype = np.dtype(dtype)
        if params is None:
            params = init_params(cfg, seed, self.dtype)
        self.params: Params = {}
        self.load_numpy_weights(params, "parameters")
        self.grads: Params = {k: np.zeros_like(v) for k, v in self.params.items()}
        self._cache: GPTCache | None = None

    def num_params(self) -> int:
        return sum(v.size for v in self.params.values())

    def forward(self, idx: np.ndarray, targets: np.ndarray | None = None,
                rng: np.random.Generator | None = None) -> tuple[np.ndarray, float | None]:
        """(logits, loss); the cache is kept for `backward`. Dropout only with an rng."""
        logits, loss, self._cache = gpt_forward(self.params, self.cfg, idx, targets, rng)
        return logits, loss

    def backward(self, dloss: float = 1.0) -> Params:
        """Add dloss * dL/dparams of the last forward into `self.grads` and return them."""
        if self._cache is None:
            raise RuntimeError("backward() needs a forward() with targets first")
        cache, self._cache = self._cache, None  # free the activations as soon as possible
        return gpt_backward(cache, self.grads, dloss)

    def zero_grad(self) -> None:
        for g in self.grads.values():
            g.fill(0.0)

    def numpy_weights(self) -> dict[str, np.ndarray]:
        """The weights as float32 copies, keyed by the checkpoint names."""
        return {k: v.astype(np.float32) for k, v in self.params.items()}

    def load_numpy_weights(self, weights: dict[str, np.ndarray], where: str = "checkpoint"
                           ) -> None:
        """Copy `weights` in (converted to the model's dtype) after checking names and shapes."""
        shapes = param_shapes(self.cfg)
        missing = sorted(set(shapes) - set(weights))
        unexpected = sorted(set(weights) - set(shapes))
        if missing or unexpected:
            raise UserError(f"{where} does not match the model config: missing {missing[:3]}, "
                            f"unexpected {unexpected[:3]}")
        for name, shape in shapes.items():
            w = np.asarray(weights[name])
            if tuple(w.shape) != shape:
                raise UserError(f"{where}: {name} has shape {tuple(w.shape)}, the config "
                                f"expects {shape}")
            if name in self.params:
                self.params[name][...] = w  # in place: optimizer state keeps pointing at it
            else:
                self.params[name] = np.array(w, dtype=self.dtype)

"""The whole GPT in NumPy: forward (with an optional KV cache), hand-written backward, the loss.

    h0 = Drop(E[x] + positions)                 the positions unit (positions.py) adds what
                                                the config adds (P[pos], ...) and gives the
                                                rotation attention applies (RoPE)
    h  = block_i(h)                             i = 0 .. n_layer-1 (see block.py), with the
                                                links of skips.py and value_embeds.py
    logits = Norm_f(h) W_head^T (+ b_head)      W_head = E when the head is tied
    logits = c tanh(logits / c)                 with model.logit_softcap = c (softcap.py)
    L = mean cross-entropy over targets != -1

The backward pass runs the same chain in reverse; with a tied head the embedding table receives
two gradients (the lookup's scatter-add and the head's dW), which add up
(docs/derivations/embedding.md, docs/derivations/head-and-loss.md). `gpt_forward` /
`gpt_backward` are plain functions over a parameter dict (the checkpoint's names); `GPT` holds
the parameters, preallocated gradient buffers and the forward cache between the two calls.

The same `gpt_forward` generates: with a KV cache (sheepop.arch.kv_cache) the tokens continue
the cached positions and each attention reads the stored keys and values, so a decode step
costs one position's work and gives the logits a full forward pass over the whole sequence would.

Units that wrap the model (LoRA: sheepop.scratch.lora) build the weights it runs on and read
the gradients it returns; nothing here knows them.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any, NamedTuple

import numpy as np

from sheepop.arch.batch import allowed_keys
from sheepop.arch.hooks import Hook, Hooks
from sheepop.arch.kv_cache import KVCache, slides
from sheepop.arch.links import SKIP_WEIGHTS
from sheepop.arch.packed import Packed
from sheepop.config.schema import ModelConfig
from sheepop.scratch.attention import additive
from sheepop.scratch.block import block_backward, block_forward
from sheepop.scratch.hooks import active
from sheepop.scratch.init import check_weights, init_params, param_shapes
from sheepop.scratch.layers import (
    CrossEntropyCache,
    cross_entropy_backward,
    cross_entropy_forward,
    dropout_backward,
    dropout_forward,
    embedding_backward,
    embedding_forward,
    linear_backward,
    linear_forward,
)
from sheepop.scratch.norm import norm_backward, norm_forward
from sheepop.scratch.positions import positions_backward, positions_draw, positions_forward
from sheepop.scratch.qk_norm import with_qk_norm
from sheepop.scratch.skips import (
    skip_backward,
    skip_forward,
    skip_keep,
    skip_kept_backward,
    skips_start,
)
from sheepop.scratch.softcap import softcap_backward, softcap_forward
from sheepop.scratch.value_embeds import value_embeds_backward, value_embeds_forward

Params = dict[str, np.ndarray]


def token_tables(params: Params) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(E, W_head, b_head) as the model uses them: W_head = E when the head is tied."""
    tok = params["tok_emb.weight"]
    return tok, params.get("head.weight", tok), params.get("head.bias")


def check_names(params: Params, cfg: ModelConfig) -> None:
    """Every name in `params` is one of the model's: a wrapped unit's parameters left in the
    dict would otherwise be silently ignored."""
    unknown = params.keys() - param_shapes(cfg).keys()
    if unknown:
        raise ValueError(f"params hold {sorted(unknown)[:3]}, which this model does not have "
                         "(LoRA adapters go through sheepop.scratch.lora: pass their "
                         "LoraConfig to lora_forward)")


def uses_rng(cfg: ModelConfig) -> bool:
    """Whether a training step draws random numbers (dropout, or the positions' own draws):
    then it passes its generator to `gpt_forward`, else none (the same as an evaluation)."""
    return cfg.dropout > 0 or positions_draw(cfg)


class GPTCache(NamedTuple):
    emb: Any
    pos: Any
    drop: np.ndarray | None
    blocks: list
    ln_f: Any
    head: Any
    softcap: np.ndarray | None  # tanh(z / c), model.logit_softcap (None: off)
    tied: bool
    loss: CrossEntropyCache | None
    cfg: ModelConfig
    values: Any = None  # model.value_embeds (value_embeds.py)
    skips: Any = None   # model.unet_skips (skips.py)
    replaced: bool = False  # a hook replaced a point in this pass: no backward (gpt_backward)


def gpt_forward(params: Params, cfg: ModelConfig, idx: np.ndarray,
                targets: np.ndarray | None = None, rng: np.random.Generator | None = None,
                cache: KVCache | None = None, pos_ids: np.ndarray | None = None,
                key_mask: np.ndarray | None = None, last_only: bool = False
                ) -> tuple[np.ndarray, float | None, GPTCache]:
    """Logits (B, T, V), the mean loss (None without targets) and the cache for the backward.

    Dropout is applied only when an `rng` is given (training); without one this is evaluation.
    Generation: `idx` continues the positions held in the KV `cache`, which grows by T;
    `last_only` computes the head for the last position only. For left-padded batches,
    `pos_ids` (B, T) gives each token's position in its own row and `key_mask` (B, cached + T)
    is True at real tokens (sheepop.arch.batch). The backward pass is for uncached forwards: a
    forward with a KV cache (generation, evaluation) keeps no layer's cache, since nothing goes
    backward through it and each layer's attention weights (B, H, T, T) would be held at once
    (SmolLM2's 30 layers, 9 heads and 8,192 positions: 72 GB).
    With rope a sequence may pass block_size: each query then attends over the block_size most
    recent keys (sliding-window attention; a rolling cache computes the same).
    `params` holds the model's parameters and nothing else (`check_names`, on every forward
    that starts a sequence). The hooks of sheepop.scratch.hooks read or replace its named
    points (embed, each block's, final_norm, logits; docs/hooks.md).
    A `Packed` cache (sheepop.arch.packed) holds several sequences' new tokens end to end in one
    row, `idx` (1, N) with `pos_ids` their positions: every unit but attention runs over them at
    once, attention per sequence against its own cache (self_attention_forward), and
    `last_only` keeps each sequence's last token.
    """
    idx = np.asarray(idx)
    T = idx.shape[-1]
    packed = isinstance(cache, Packed)  # several sequences' tokens in one row (pos_ids given)
    start = cache.length if cache is not None and not packed else 0
    if start == 0:
        check_names(params, cfg)
    if start + T > cfg.block_size and not slides(cfg):
        raise ValueError(f"sequence of {start + T} tokens exceeds block_size {cfg.block_size}")
    pos = slice(start, start + T) if pos_ids is None else pos_ids
    tok, w_head, b_head = token_tables(params)
    h, emb = embedding_forward(idx, tok)
    h, rotate, pos_cache = positions_forward(h, params, cfg, idx, pos, cache, rng)
    if cfg.qk_norm:  # queries and keys normalised, then turned (sheepop.scratch.qk_norm)
        rotate = with_qk_norm(rotate, cfg.ln_eps)
    past = cache.query_offset(T) if cache is not None and not packed else 0
    mask = None  # (packed: each part's own, in `cache`)
    if not packed and (key_mask is not None or past + T > cfg.block_size):
        mask = additive(allowed_keys(T, past, key_mask, cfg.block_size))
    h, drop = dropout_forward(h, cfg.dropout, rng)
    hooks = active()
    replaced_before = 0 if hooks is None else hooks.replaced
    if hooks is not None:
        h = hooks.at("embed", h)
    values, value_cache = value_embeds_forward(params, cfg, idx)
    skips = skips_start(params, cfg)
    blocks = []
    for i in range(cfg.n_layer):
        h = skip_forward(h, i, skips)
        h, block_cache = block_forward(h, params, f"blocks.{i}.", cfg, rng, cache, i, mask,
                                       rotate, values[i])
        skip_keep(h, i, skips)
        if cache is None:
            blocks.append(block_cache)
    if cache is not None:
        cache.advance(T)
    if last_only:  # (packed: each row's last token, sheepop.arch.packed)
        h = h[:, cache.last] if packed else h[:, -1:, :]
    h, ln_f = norm_forward(cfg.norm, h, params, "ln_f.", cfg.ln_eps)
    if hooks is not None:
        h = hooks.at("final_norm", h)
    logits, head = linear_forward(h, w_head, b_head)
    logits, capped = softcap_forward(logits, cfg.logit_softcap)
    if hooks is not None:
        logits = hooks.at("logits", logits)
    loss, loss_cache = (None, None) if targets is None else cross_entropy_forward(
        logits, np.asarray(targets))
    tied = "head.weight" not in params
    replaced = hooks is not None and hooks.replaced > replaced_before
    return logits, loss, GPTCache(emb, pos_cache, drop, blocks, ln_f, head, capped, tied,
                                  loss_cache, cfg, value_cache, skips, replaced)


def new_cache(cfg: ModelConfig, batch: int = 1, max_len: int | None = None,
              dtype: type = np.float32) -> KVCache:
    """A KV cache of up to `max_len` (default block_size) positions in NumPy buffers, growing
    with the tokens (sheepop.arch.kv_cache); the allocation hook is np.empty (the cache zeroes
    what it must)."""
    return KVCache.growing(cfg, batch, partial(np.empty, dtype=dtype), max_len)


def gpt_backward(cache: GPTCache, grads: Params | None = None, dloss: float = 1.0,
                 dlogits: np.ndarray | None = None,
                 gradients: Mapping[str, Hook] | None = None) -> Params:
    """dL/d(every parameter) by the chain rule, from dL/dlogits (the loss's, scaled by `dloss`,
    unless `dlogits` is given). Gradients are *added* into `grads` when given (accumulation over
    micro-batches into preallocated buffers); otherwise a new dict is returned.

    `gradients` (point name -> hook) reads dL/d(point) at the hook points the backward passes
    (GRADIENT_POINTS: embed, and each block's resid_in, resid_mid, resid_out, attn.out,
    attn.heads, ffn.out), called as hook(gradient, point) in the backward's order; the array is
    the backward's own (a hook that keeps it copies it). A forward pass in which a hook
    replaced a point has no backward here: each layer's cache holds its own inputs, so the
    chain would run through the replaced value as if the hook were the identity, where the
    replacement cut it (a ValueError says so)."""
    new: dict[str, np.ndarray | None] = {}
    if len(cache.blocks) != cache.cfg.n_layer:
        raise ValueError("gpt_backward needs a forward without a KV cache (a cached one keeps "
                         "no layer's cache)")
    if cache.replaced:
        raise ValueError("gpt_backward of a pass in which a hook replaced a point is not "
                         "defined (the layers' caches do not see the hook): observe only")
    at = gradient_hooks(cache.cfg, gradients)
    if dlogits is None:
        if cache.loss is None:
            raise ValueError("gpt_backward needs a forward with targets, or dlogits")
        dlogits = cross_entropy_backward(dloss, cache.loss)
    dlogits = softcap_backward(dlogits, cache.softcap)
    dh, dw_head, new["head.bias"] = linear_backward(dlogits, cache.head)
    dh, ln_f_grads = norm_backward(cache.cfg.norm, dh, cache.ln_f, "ln_f.")
    new.update(ln_f_grads)
    dkept, dmixes = {}, [None] * len(cache.blocks)
    if cache.skips.weights is not None:
        new[SKIP_WEIGHTS] = np.zeros_like(cache.skips.weights)
    for i in reversed(range(len(cache.blocks))):
        dh = skip_kept_backward(dh, i, dkept)
        dh, block_grads = block_backward(dh, cache.blocks[i], f"blocks.{i}.",
                                         None if at is None else at.blocks[i])
        dmixes[i] = block_grads.pop(f"blocks.{i}.attn.values", None)
        skip_backward(dh, i, cache.skips, dkept, new.get(SKIP_WEIGHTS))
        new.update(block_grads)
    new.update(value_embeds_backward(dmixes, cache.values))
    if at is not None:
        dh = at.at("embed", dh)
    dh = dropout_backward(dh, cache.drop)
    new.update(positions_backward(dh, cache.pos))
    new["tok_emb.weight"] = embedding_backward(dh, cache.emb)
    # The head's weight gradient belongs to the embedding table when the two are tied.
    if cache.tied:
        new["tok_emb.weight"] += dw_head
    else:
        new["head.weight"] = dw_head
    return deliver(new, grads)


GRADIENT_POINTS = ("resid_in", "resid_mid", "resid_out", "attn.out", "attn.heads", "ffn.out")
"""The block points whose gradient gpt_backward can read (and the model's `embed`)."""


def gradient_hooks(cfg: ModelConfig, gradients: Mapping[str, Hook] | None) -> Hooks | None:
    """The gradient hooks of one backward pass, checked: a point the backward never reaches
    (the pattern, the logits) is a ValueError naming it, not a hook that silently never runs."""
    if not gradients:
        return None
    hooks = Hooks(cfg, gradients)
    for name in gradients:
        if name != "embed" and name.split(".", 2)[-1] not in GRADIENT_POINTS:
            raise ValueError(f"the NumPy backward reads no gradient at {name!r} (it reads "
                             f"embed and each block's {', '.join(GRADIENT_POINTS)})")
    return hooks


def deliver(new: dict[str, np.ndarray | None], grads: Params | None) -> Params:
    """The computed gradients as a new dict, or added into `grads`."""
    if grads is None:
        return {k: v for k, v in new.items() if v is not None}
    for name, g in new.items():
        if g is not None:
            grads[name] += g
    return grads


class GPT:
    """The NumPy GPT: parameters (float32 or float64), gradient buffers reused across steps.

    `forward_pass` / `backward_pass` are the model's functions; a unit that wraps the model (LoRA,
    sheepop.scratch.lora.LoraGPT) overrides them and `trainable_shapes`."""

    def __init__(self, cfg: ModelConfig, params: Params | None = None,
                 dtype: type | str = np.float32, seed: int = 0):
        self.cfg = cfg
        self.dtype = np.dtype(dtype)
        self.seed = seed
        if params is None:
            params = init_params(cfg, seed, self.dtype)
        self.params: Params = {}
        self.load_numpy_weights(params, "parameters")
        self.grads: Params = {name: np.zeros(shape, self.dtype)
                              for name, shape in self.trainable_shapes().items()}
        self._cache: Any = None

    def trainable_shapes(self) -> dict[str, tuple[int, ...]]:
        """The parameters that have gradients, by name: every one."""
        return param_shapes(self.cfg)

    def forward_pass(self, idx: np.ndarray, targets: np.ndarray | None,
                 rng: np.random.Generator | None) -> tuple[np.ndarray, float | None, Any]:
        return gpt_forward(self.params, self.cfg, idx, targets, rng)

    def backward_pass(self, cache: Any, dloss: float, dlogits: np.ndarray | None = None
                      ) -> Params:
        return gpt_backward(cache, self.grads, dloss, dlogits)

    def num_params(self) -> int:
        """Every parameter (a wrapping unit's included)."""
        return sum(v.size for v in self.params.values())

    def trainable_params(self) -> int:
        """The parameters that have gradients."""
        return sum(v.size for v in self.grads.values())

    def forward(self, idx: np.ndarray, targets: np.ndarray | None = None,
                rng: np.random.Generator | None = None) -> tuple[np.ndarray, float | None]:
        """(logits, loss); the cache is kept for `backward`. Dropout only with an rng."""
        logits, loss, self._cache = self.forward_pass(idx, targets, rng)
        return logits, loss

    def loss(self, idx: np.ndarray, targets: np.ndarray) -> float:
        """The mean loss, without dropout and without keeping the activations."""
        return self.forward_pass(idx, targets, None)[1]

    def backward(self, dloss: float = 1.0, dlogits: np.ndarray | None = None) -> Params:
        """Add dloss * dL/dparams of the last forward into `self.grads` and return them; with
        `dlogits` (dL/dlogits of any loss, e.g. sheepop.scratch.logprob's) from those."""
        if self._cache is None:
            raise RuntimeError("backward() needs a forward() first")
        cache, self._cache = self._cache, None  # free the activations as soon as possible
        return self.backward_pass(cache, dloss, dlogits)

    def zero_grad(self) -> None:
        for g in self.grads.values():
            g.fill(0.0)

    def numpy_weights(self) -> dict[str, np.ndarray]:
        """The weights as float32 copies, keyed by the checkpoint names."""
        return {k: v.astype(np.float32) for k, v in self.params.items()}

    def load_numpy_weights(self, weights: dict[str, np.ndarray], where: str = "checkpoint"
                           ) -> None:
        """Copy `weights` in (converted to the model's dtype) after checking names and shapes."""
        self.copy_in(weights, check_weights(self.cfg, weights, where))

    def copy_in(self, weights: dict[str, np.ndarray], names: list[str]) -> None:
        """params[name] = weights[name] for each name (in place when it exists: optimizer state
        keeps pointing at it)."""
        for name in names:
            w = weights[name]
            if name in self.params:
                self.params[name][...] = w
            else:
                self.params[name] = np.array(w, dtype=self.dtype)

"""The whole GPT in NumPy: forward (with an optional KV cache), hand-written backward, the loss.

    h0 = Drop(E[x] + P[pos] (+ A[place] + N[term]))   positions: model.pos_encoding
                                                (positions.py); digit places, term indices:
                                                model.digit_positions, model.term_positions
    h  = block_i(h)                             i = 0 .. n_layer-1 (see block.py)
    logits = Norm_f(h) W_head^T (+ b_head)      W_head = E when the head is tied
    L = mean cross-entropy over targets != -1

The backward pass runs the same chain in reverse; with a tied head the embedding table receives
two gradients (the lookup's scatter-add and the head's dW), which add up. `gpt_forward` /
`gpt_backward` are plain functions over a parameter dict (the checkpoint's names); `GPT` holds
the parameters, preallocated gradient buffers and the forward cache between the two calls.

The same `gpt_forward` generates: with a KV cache (sheepop.arch.kv_cache) the tokens continue
the cached positions and each attention reads the stored keys and values, so a decode step
costs one position's work and gives the logits a full forward pass over the whole sequence would.

With LoRA (`lora`, a LoraConfig) the parameter dict also holds adapters ("blocks.0.attn.qkv.lora_A",
...): each adapted linear layer adds (alpha / r) (x A^T) B^T, every base weight is frozen, and
the backward pass returns the adapters' gradients only (docs/finetune.md). With
`lora.new_tokens` = n it also holds the new tokens' trained rows ("tok_emb.new_rows", ...),
which replace the last n rows of their tables, E' = [E[:V-n]; new_rows]; their gradient is the
last n rows of dE' (the lookup's scatter-add, plus a tied head's dW rows).
"""

from __future__ import annotations

from functools import partial
from typing import Any, NamedTuple

import numpy as np

from sheepop.arch.batch import allowed_keys
from sheepop.arch.kv_cache import KVCache, slides
from sheepop.arch.lora import (
    LoraConfig,
    check_adapters,
    init_adapters,
    is_adapter,
    with_new_rows,
)
from sheepop.config.schema import ModelConfig
from sheepop.positional import ROTATED_BY_DIGITS, uses_digits
from sheepop.scratch.attention import additive
from sheepop.scratch.block import block_backward, block_forward
from sheepop.scratch.init import check_weights, init_params
from sheepop.scratch.layers import (
    FROZEN,
    CrossEntropyCache,
    cross_entropy_backward,
    cross_entropy_forward,
    dropout_backward,
    dropout_forward,
    embedding_backward,
    embedding_forward,
    embedding_rows_backward,
    linear_backward,
    linear_forward,
    linear_rows_backward,
)
from sheepop.scratch.norm import norm_backward, norm_forward
from sheepop.scratch.positions import (
    POSITIONS,
    digit_positions_backward,
    digit_positions_forward,
    digit_rows,
)

Params = dict[str, np.ndarray]


def _row_table(params: Params, table: str, rows: str) -> np.ndarray | None:
    """params[table], its last rows replaced by params[rows] when LoRA trains them."""
    t = params.get(table)
    return t if rows not in params or t is None else with_new_rows(t, params[rows])


def token_tables(params: Params) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(E, W_head, b_head) as the model uses them: the stored ones, or, under LoRA with new
    tokens, with the trained rows in place of their last rows."""
    tok = _row_table(params, "tok_emb.weight", "tok_emb.new_rows")
    w_head = _row_table(params, "head.weight", "head.new_rows")
    return tok, tok if w_head is None else w_head, _row_table(params, "head.bias",
                                                              "head.new_bias")


class GPTCache(NamedTuple):
    emb: Any
    pos: Any
    drop: np.ndarray | None
    blocks: list
    ln_f: Any
    head: Any
    tied: bool
    loss: CrossEntropyCache | None
    cfg: ModelConfig
    frozen: bool = False  # LoRA: the base weights get no gradient
    new_tokens: int = 0   # LoRA: the trained rows at the end of the per-token tables
    digit: Any = None     # digit places, term indices: the rows read, by table


def gpt_forward(params: Params, cfg: ModelConfig, idx: np.ndarray,
                targets: np.ndarray | None = None, rng: np.random.Generator | None = None,
                cache: KVCache | None = None, pos_ids: np.ndarray | None = None,
                key_mask: np.ndarray | None = None, last_only: bool = False,
                lora: LoraConfig | None = None, residuals: list[np.ndarray] | None = None
                ) -> tuple[np.ndarray, float | None, GPTCache]:
    """Logits (B, T, V), the mean loss (None without targets) and the cache for the backward.

    Dropout is applied only when an `rng` is given (training); without one this is evaluation.
    Generation: `idx` continues the positions held in the KV `cache`, which grows by T;
    `last_only` computes the head for the last position only. For left-padded batches,
    `pos_ids` (B, T) gives each token's position in its own row and `key_mask` (B, cached + T)
    is True at real tokens (sheepop.arch.batch). The backward pass is for uncached forwards.
    With rope a sequence may pass block_size: each query then attends over the block_size most
    recent keys (sliding-window attention; a rolling cache computes the same).
    With `lora`, the adapters in `params` are applied with s = alpha / r and the base weights
    are frozen; adapters in `params` without `lora` are an error (they would be ignored).
    `residuals`, a list, receives the residual stream h_0 (after the embedding) and each
    block's output h_1 .. h_L (the logit lens reads them, sheepop.arch.inspect).
    """
    if lora is None and any(is_adapter(name) for name in params):
        raise ValueError("params hold LoRA adapters: pass their LoraConfig as `lora`")
    idx = np.asarray(idx)
    T = idx.shape[-1]
    start = cache.length if cache is not None else 0
    if start + T > cfg.block_size and not slides(cfg):
        raise ValueError(f"sequence of {start + T} tokens exceeds block_size {cfg.block_size}")
    pos = slice(start, start + T) if pos_ids is None else pos_ids
    kind = POSITIONS[cfg.pos_encoding]
    tok, w_head, b_head = token_tables(params)
    h, emb = embedding_forward(idx, tok)
    pos_cache = None
    if kind.embed_forward is not None:
        pos_values, pos_cache = kind.embed_forward(params, cfg, pos, tok.dtype)
        h += pos_values
    digit_cache = None
    if uses_digits(cfg):
        rows, numbers = digit_rows(idx, cfg, pos, cache, rng)  # + A[place] + N[term index]
        digit_values, digit_cache = digit_positions_forward(params, rows)
        h += digit_values
        if cfg.pos_encoding in ROTATED_BY_DIGITS:
            pos = numbers  # queries and keys turn by their number (and digit place)
    rotate = None if kind.rotate_forward is None else (
        partial(kind.rotate_forward, pos=pos, cfg=cfg), kind.rotate_backward)
    past = cache.query_offset(T) if cache is not None else 0
    mask = None
    if key_mask is not None or past + T > cfg.block_size:
        mask = additive(allowed_keys(T, past, key_mask, cfg.block_size))
    h, drop = dropout_forward(h, cfg.dropout, rng)
    blocks = []
    if residuals is not None:
        residuals.append(h)
    for i in range(cfg.n_layer):
        h, block_cache = block_forward(h, params, f"blocks.{i}.", cfg, rng, cache, i, mask,
                                       rotate, lora)
        blocks.append(block_cache)
        if residuals is not None:
            residuals.append(h)
    if cache is not None:
        cache.advance(T)
    if last_only:
        h = h[:, -1:, :]
    h, ln_f = norm_forward(cfg.norm, h, params, "ln_f.", cfg.ln_eps)
    logits, head = linear_forward(h, w_head, b_head, None if lora is None else FROZEN)
    loss, loss_cache = (None, None) if targets is None else cross_entropy_forward(
        logits, np.asarray(targets))
    tied = "head.weight" not in params
    new_tokens = lora.new_tokens if lora is not None and "tok_emb.new_rows" in params else 0
    return logits, loss, GPTCache(emb, pos_cache, drop, blocks, ln_f, head, tied, loss_cache,
                                  cfg, lora is not None, new_tokens, digit_cache)


def new_cache(cfg: ModelConfig, batch: int = 1, max_len: int | None = None,
              dtype: type = np.float32) -> KVCache:
    """A KV cache of up to `max_len` (default block_size) positions in NumPy buffers, growing
    with the tokens (sheepop.arch.kv_cache); the allocation hook is np.zeros."""
    return KVCache.growing(cfg, batch, partial(np.zeros, dtype=dtype), max_len)


def gpt_backward(cache: GPTCache, grads: Params | None = None, dloss: float = 1.0,
                 dlogits: np.ndarray | None = None) -> Params:
    """dL/d(every parameter) by the chain rule, from dL/dlogits (the loss's, scaled by `dloss`,
    unless `dlogits` is given). Gradients are *added* into `grads` when given (accumulation over
    micro-batches into preallocated buffers); otherwise a new dict is returned. After a LoRA
    forward only the adapters get gradients (the embeddings' and every dW are not computed)."""
    new: dict[str, np.ndarray | None] = {}
    if dlogits is None:
        if cache.loss is None:
            raise ValueError("gpt_backward needs a forward with targets, or dlogits")
        dlogits = cross_entropy_backward(dloss, cache.loss)
    dh, dw_head, new["head.bias"] = linear_backward(dlogits, cache.head)
    dh, ln_f_grads = norm_backward(cache.cfg.norm, dh, cache.ln_f, "ln_f.")
    new.update(ln_f_grads)
    for i in reversed(range(len(cache.blocks))):
        dh, block_grads = block_backward(dh, cache.blocks[i], f"blocks.{i}.")
        new.update(block_grads)
    if cache.frozen:
        new = {k: v for k, v in new.items() if is_adapter(k)}
        if cache.new_tokens:
            new.update(_new_rows_grads(dh, dlogits, cache))
        return _deliver(new, grads)
    dh = dropout_backward(dh, cache.drop)
    embed_backward = POSITIONS[cache.cfg.pos_encoding].embed_backward
    if embed_backward is not None:
        new.update(embed_backward(dh, cache.pos))
    if cache.digit is not None:
        new.update(digit_positions_backward(dh, cache.digit))
    new["tok_emb.weight"] = embedding_backward(dh, cache.emb)
    # The head's weight gradient belongs to the embedding table when the two are tied.
    if cache.tied:
        new["tok_emb.weight"] += dw_head
    else:
        new["head.weight"] = dw_head
    return _deliver(new, grads)


def _new_rows_grads(dh: np.ndarray, dlogits: np.ndarray, cache: GPTCache
                    ) -> dict[str, np.ndarray | None]:
    """LoRA's new-token rows: the last n rows of dE' (lookup) and of dW_head', db_head'."""
    first = cache.emb.vocab_size - cache.new_tokens
    dw_rows, db_rows = linear_rows_backward(dlogits, cache.head, first)
    demb_rows = embedding_rows_backward(dropout_backward(dh, cache.drop), cache.emb, first)
    if cache.tied:
        return {"tok_emb.new_rows": demb_rows + dw_rows, "head.new_bias": db_rows}
    return {"tok_emb.new_rows": demb_rows, "head.new_rows": dw_rows, "head.new_bias": db_rows}


def _deliver(new: dict[str, np.ndarray | None], grads: Params | None) -> Params:
    """The computed gradients as a new dict, or added into `grads`."""
    if grads is None:
        return {k: v for k, v in new.items() if v is not None}
    for name, g in new.items():
        if g is not None:
            grads[name] += g
    return grads


class GPT:
    """The NumPy GPT: parameters (float32 or float64), gradient buffers reused across steps.

    With `lora` the parameters also hold adapters (`adapters`, or fresh ones from
    sheepop.arch.lora.init_adapters(seed)); the base weights are frozen and only the adapters
    have gradient buffers."""

    def __init__(self, cfg: ModelConfig, params: Params | None = None,
                 dtype: type | str = np.float32, seed: int = 0, lora: LoraConfig | None = None,
                 adapters: Params | None = None):
        self.cfg = cfg
        self.dtype = np.dtype(dtype)
        if params is None:
            params = init_params(cfg, seed, self.dtype)
        self.params: Params = {}
        self.load_numpy_weights(params, "parameters")
        self.lora = lora
        if lora is not None:
            self.load_adapters(init_adapters(cfg, lora, seed, self.dtype, self.params)
                               if adapters is None else adapters)
        self.grads: Params = {k: np.zeros_like(v) for k, v in self.params.items()
                              if lora is None or is_adapter(k)}
        self._cache: GPTCache | None = None

    def num_params(self) -> int:
        """Every parameter, adapters included."""
        return sum(v.size for v in self.params.values())

    def trainable_params(self) -> int:
        """The parameters that have gradients: all, or the adapters under LoRA."""
        return sum(v.size for v in self.grads.values())

    def forward(self, idx: np.ndarray, targets: np.ndarray | None = None,
                rng: np.random.Generator | None = None) -> tuple[np.ndarray, float | None]:
        """(logits, loss); the cache is kept for `backward`. Dropout only with an rng."""
        logits, loss, self._cache = gpt_forward(self.params, self.cfg, idx, targets, rng,
                                                lora=self.lora)
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
        self._copy_in(weights, check_weights(self.cfg, weights, where))

    def load_adapters(self, adapters: dict[str, np.ndarray], where: str = "adapters") -> None:
        """Copy LoRA adapters in, after checking them against the model's LoraConfig."""
        check_adapters(self.cfg, self.lora, adapters, where)
        self._copy_in(adapters, list(adapters))

    def _copy_in(self, weights: dict[str, np.ndarray], names: list[str]) -> None:
        for name in names:
            w = weights[name]
            if name in self.params:
                self.params[name][...] = w  # in place: optimizer state keeps pointing at it
            else:
                self.params[name] = np.array(w, dtype=self.dtype)

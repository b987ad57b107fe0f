"""Inference with a key/value cache, and the NumPy side of the shared generation loop.

During generation the keys and values of earlier positions never change (attention is causal),
so each block stores them in a preallocated (B, H, T_max, d_k) buffer; a decode step computes
Q, K, V for the new token only and attends over the stored keys:

    S = q K[:n]^T / sqrt(d_k),  A = softmax(S),  y = A V[:n]          (no mask needed for one
                                                                       query at the last position)
A prompt of several tokens (prefill) uses the causal mask offset by the cached length. The
logits are the same as a full forward pass over the whole sequence (tests check it).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sheepop.config import ModelConfig
from sheepop.scratch.attention import attention_core_forward, merge_heads, split_heads
from sheepop.scratch.block import ffn_forward
from sheepop.scratch.gpt import GPT, gpt_forward, head_weight, positions
from sheepop.scratch.layers import embedding_forward, layernorm_forward, linear_forward

Params = dict[str, np.ndarray]


class KVCache:
    """Keys and values of every layer: two (n_layer, B, H, T_max, d_k) buffers, filled in place."""

    def __init__(self, cfg: ModelConfig, batch: int = 1, max_len: int | None = None,
                 dtype: type = np.float32):
        shape = (cfg.n_layer, batch, cfg.n_head, max_len or cfg.block_size, cfg.head_dim)
        self.k = np.zeros(shape, dtype=dtype)
        self.v = np.zeros(shape, dtype=dtype)
        self.max_len = shape[3]
        self.length = 0

    def reset(self) -> None:
        self.length = 0

    def update(self, layer: int, k_new: np.ndarray, v_new: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
        """Store (B, H, t, d_k) keys/values after the cached ones; return all of them (views)."""
        start, end = self.length, self.length + k_new.shape[2]
        if end > self.max_len:
            raise ValueError(f"KV cache full: {end} positions > max_len {self.max_len}")
        self.k[layer, :, :, start:end] = k_new
        self.v[layer, :, :, start:end] = v_new
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]


def padded_causal_mask(T: int, past: int, key_mask: np.ndarray) -> np.ndarray:
    """Additive (B, 1, T, past + T) mask: causal, padding keys (key_mask False) hidden, and
    every query always sees itself (so a padding query's row is never all -inf)."""
    q_pos = np.arange(past, past + T)[:, None]
    k_pos = np.arange(past + T)[None, :]
    allowed = ((k_pos <= q_pos) & key_mask[:, None, :past + T]) | (k_pos == q_pos)
    return np.where(allowed, 0.0, -np.inf).astype(np.float32)[:, None]


def forward_cached(params: Params, cfg: ModelConfig, idx: np.ndarray, cache: KVCache,
                   last_only: bool = True, pos_ids: np.ndarray | None = None,
                   key_mask: np.ndarray | None = None) -> np.ndarray:
    """Logits for tokens `idx` (B, t) that continue the cached positions; the cache grows by t.

    The same layers as `gpt_forward`, evaluation mode (no dropout), keys/values from the cache.
    For left-padded batches, `pos_ids` (B, t) gives each token's position in its own row and
    `key_mask` (B, cached + t) is True at real tokens.
    """
    idx = np.asarray(idx)
    T = idx.shape[-1]
    past = cache.length
    tok = params["tok_emb.weight"]
    h, _ = embedding_forward(idx, tok)
    if pos_ids is None:
        h += positions(params, cfg, past, T, tok.dtype)[0]
    else:
        h += positions(params, cfg, 0, cfg.block_size, tok.dtype)[0][pos_ids]
    mask = None if key_mask is None else padded_causal_mask(T, past, key_mask)
    for i in range(cfg.n_layer):
        p = lambda name, i=i: params.get(f"blocks.{i}.{name}")  # noqa: E731
        a_in, _ = layernorm_forward(h, p("ln1.weight"), p("ln1.bias"), cfg.ln_eps)
        qkv, _ = linear_forward(a_in, p("attn.qkv.weight"), p("attn.qkv.bias"))
        q, k, v = split_heads(qkv, cfg.n_head)
        k_all, v_all = cache.update(i, k, v)
        y, _ = attention_core_forward(q, k_all, v_all, mask=mask)  # causal, offset by `past`
        a, _ = linear_forward(merge_heads(y), p("attn.proj.weight"), p("attn.proj.bias"))
        h = h + a
        f_in, _ = layernorm_forward(h, p("ln2.weight"), p("ln2.bias"), cfg.ln_eps)
        f, _ = ffn_forward(f_in, p("ffn.fc.weight"), p("ffn.fc.bias"), p("ffn.proj.weight"),
                           p("ffn.proj.bias"), cfg.activation)
        h = h + f
    cache.length += T
    if last_only:
        h = h[:, -1:, :]
    h, _ = layernorm_forward(h, params["ln_f.weight"], params["ln_f.bias"], cfg.ln_eps)
    return linear_forward(h, head_weight(params), params.get("head.bias"))[0]


PAD_ID = 0  # any valid id: padding tokens are embedded but never seen by a real token


def left_pad(rows: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Token ids (B, L) right-aligned, positions counted from each row's first real token, and
    the real-token mask, as the torch engine's `left_pad`."""
    if not rows or any(len(r) == 0 for r in rows):
        raise ValueError("every row of a batch needs at least one token")
    L = max(len(r) for r in rows)
    idx = np.full((len(rows), L), PAD_ID, dtype=np.int64)
    real = np.zeros((len(rows), L), dtype=bool)
    for b, row in enumerate(rows):
        idx[b, L - len(row):] = list(row)
        real[b, L - len(row):] = True
    pos = np.maximum(np.cumsum(real, axis=1) - 1, 0)
    return idx, pos, real


class NumpyLM:
    """The NumPy engine in the shared generation loops: next-token logits as NumPy for one
    sequence (`sheepop.generate.LanguageModel`) or a left-padded batch (`BatchLanguageModel`),
    with preallocated KV caches."""

    def __init__(self, cfg: ModelConfig, weights: Params, dtype: type = np.float32):
        self.model = GPT(cfg, weights, dtype)
        self.cfg = cfg
        self.block_size = cfg.block_size
        self.cache = KVCache(cfg, 1, dtype=self.model.dtype)
        # Batch state: a cache of B rows, which key columns hold real tokens, and each row's
        # next position (rows count positions from their own first real token).
        self.batch_cache: KVCache | None = None
        self._key_mask: np.ndarray | None = None
        self._next_pos: np.ndarray | None = None
        self._padded = False

    @property
    def cache_length(self) -> int:
        return self.cache.length

    def _ids(self, ids: Sequence[int]) -> np.ndarray:
        return np.asarray(list(ids), dtype=np.int64)[None, :]

    def prefill(self, ids: Sequence[int]) -> np.ndarray:
        self.cache.reset()
        return forward_cached(self.model.params, self.cfg, self._ids(ids), self.cache)[0, -1]

    def decode(self, token: int) -> np.ndarray:
        return forward_cached(self.model.params, self.cfg, self._ids([token]), self.cache)[0, -1]

    def full(self, ids: Sequence[int]) -> np.ndarray:
        return gpt_forward(self.model.params, self.cfg, self._ids(ids))[0][0, -1]

    # ----- batches of sequences (left padding): sheepop.generate.BatchLanguageModel ---------

    @property
    def batch_length(self) -> int:
        """Columns filled in the batch cache (the longest row's length, padding included)."""
        return self.batch_cache.length if self.batch_cache is not None else 0

    def prefill_batch(self, rows: Sequence[Sequence[int]]) -> np.ndarray:
        """Start a fresh batch cache holding `rows` (left-padded); logits (B, V) after each."""
        idx, pos, real = left_pad(rows)
        B, L = idx.shape
        if self.batch_cache is None or self.batch_cache.k.shape[1] != B:
            self.batch_cache = KVCache(self.cfg, B, dtype=self.model.dtype)
        self.batch_cache.reset()
        self._padded = not bool(real.all())
        self._key_mask = np.zeros((B, self.batch_cache.max_len), dtype=bool)
        self._key_mask[:, :L] = real
        self._next_pos = np.array([len(r) for r in rows])
        kw = {"pos_ids": pos, "key_mask": self._key_mask[:, :L]} if self._padded else {}
        return forward_cached(self.model.params, self.cfg, idx, self.batch_cache, **kw)[:, -1]

    def decode_batch(self, tokens: Sequence[int]) -> np.ndarray:
        """Append one token to every row of the batch cache; logits (B, V) after them."""
        assert self.batch_cache is not None and self._next_pos is not None, "prefill_batch first"
        x = np.asarray(list(tokens), dtype=np.int64)[:, None]
        end = self.batch_cache.length + 1
        kw = {}
        if self._padded:
            self._key_mask[:, end - 1] = True
            kw = {"pos_ids": self._next_pos[:, None], "key_mask": self._key_mask[:, :end]}
        logits = forward_cached(self.model.params, self.cfg, x, self.batch_cache, **kw)[:, -1]
        self._next_pos += 1
        return logits

    def full_batch(self, rows: Sequence[Sequence[int]]) -> np.ndarray:
        """Logits (B, V) after the last token of each row, recomputed without a kept cache."""
        idx, pos, real = left_pad(rows)
        scratch = KVCache(self.cfg, idx.shape[0], idx.shape[1], self.model.dtype)
        kw = {} if real.all() else {"pos_ids": pos, "key_mask": real}
        return forward_cached(self.model.params, self.cfg, idx, scratch, **kw)[:, -1]

    def keep_rows(self, rows: Sequence[int]) -> None:
        """Keep only these rows of the batch cache (finished sequences leave the batch)."""
        assert self.batch_cache is not None and self._next_pos is not None, "prefill_batch first"
        keep = np.asarray(list(rows), dtype=np.int64)
        cache = self.batch_cache
        cache.k, cache.v = cache.k[:, keep], cache.v[:, keep]
        self._key_mask, self._next_pos = self._key_mask[keep], self._next_pos[keep]

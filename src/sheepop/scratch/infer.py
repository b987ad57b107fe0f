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


def forward_cached(params: Params, cfg: ModelConfig, idx: np.ndarray, cache: KVCache,
                   last_only: bool = True) -> np.ndarray:
    """Logits for tokens `idx` (B, t) that continue the cached positions; the cache grows by t.

    The same layers as `gpt_forward`, evaluation mode (no dropout), keys/values from the cache.
    """
    idx = np.asarray(idx)
    T = idx.shape[-1]
    tok = params["tok_emb.weight"]
    h, _ = embedding_forward(idx, tok)
    h += positions(params, cfg, cache.length, T, tok.dtype)[0]
    for i in range(cfg.n_layer):
        p = lambda name, i=i: params.get(f"blocks.{i}.{name}")  # noqa: E731
        a_in, _ = layernorm_forward(h, p("ln1.weight"), p("ln1.bias"), cfg.ln_eps)
        qkv, _ = linear_forward(a_in, p("attn.qkv.weight"), p("attn.qkv.bias"))
        q, k, v = split_heads(qkv, cfg.n_head)
        k_all, v_all = cache.update(i, k, v)
        y, _ = attention_core_forward(q, k_all, v_all)  # mask offset by the cached length
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


class NumpyLM:
    """`sheepop.generate.LanguageModel` for the NumPy engine: logits of the last position."""

    def __init__(self, cfg: ModelConfig, weights: Params, dtype: type = np.float32):
        self.model = GPT(cfg, weights, dtype)
        self.cfg = cfg
        self.block_size = cfg.block_size
        self.cache = KVCache(cfg, 1, dtype=self.model.dtype)

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

"""The NumPy engine's side of looking inside a model (sheepop.arch.inspect): one forward pass
over the prompt that keeps every layer's attention weights and residual stream.

    A_l = softmax(Q K^T / sqrt(d_k) + M)     read from each block's attention cache
    h_0, h_1 .. h_L                          gpt_forward's `residuals`
    lens(h) = Norm_f(h) W_head^T (+ b)       the model's own final norm and head
    never                                    the ids its sampler never draws
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sheepop.arch.inspect import Trace
from sheepop.scratch.gpt import gpt_forward, token_tables
from sheepop.scratch.layers import linear_forward
from sheepop.scratch.lm import NumpyLM
from sheepop.scratch.norm import norm_forward
from sheepop.scratch.positions import POSITIONS


def trace(lm: NumpyLM, ids: Sequence[int]) -> Trace:
    """The `Trace` of one prompt (at most block_size tokens), without a KV cache."""
    cfg, params = lm.cfg, lm.params
    idx = np.asarray(list(ids), dtype=np.int64)[None, :]
    residuals: list[np.ndarray] = []
    _, _, cache = gpt_forward(params, cfg, idx, residuals=residuals)
    attention = [block.attn.core.a[0] for block in cache.blocks]
    _, w_head, b_head = token_tables(params)

    def lens(h: np.ndarray) -> np.ndarray:
        normed, _ = norm_forward(cfg.norm, h, params, "ln_f.", cfg.ln_eps)
        return linear_forward(normed, w_head, b_head)[0]

    embed = POSITIONS[cfg.pos_encoding].embed_forward
    positions = None if embed is None else embed(params, cfg, slice(0, idx.shape[1]),
                                                 lm.dtype)[0]
    return Trace(attention, [h[0] for h in residuals], lens, positions,
                 tuple(lm.never_generate))

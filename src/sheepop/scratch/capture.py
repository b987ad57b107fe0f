"""The NumPy engine's side of looking inside a model (sheepop.arch.inspection): one forward pass
over the prompt, through a KV cache of its own (so no layer's cache outlives its layer), that
keeps the residual stream and the attention weights of the layers asked.

    A_l = softmax(Q K^T / sqrt(d_k) + M)     read from block l's attention cache as it passes
    h_0, h_1 .. h_L                          gpt_forward's `observe`
    lens(h) = Norm_f(h) W_head^T (+ b)       the model's own final norm and head
    never                                    the ids its sampler never draws
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np

from sheepop.arch.inspection import Trace
from sheepop.scratch.block import BlockCache
from sheepop.scratch.gpt import gpt_forward, new_cache, token_tables
from sheepop.scratch.layers import linear_forward
from sheepop.scratch.lm import NumpyLM
from sheepop.scratch.norm import norm_forward
from sheepop.scratch.positions import POSITIONS
from sheepop.scratch.softcap import softcap_forward


def trace(lm: NumpyLM, ids: Sequence[int], layers: Collection[int]) -> Trace:
    """The `Trace` of one prompt (at most block_size tokens), with the attention weights of
    `layers`. A one-token prompt's grouped-query weights come as (H_kv, groups, 1) rows
    (sheepop.scratch.attention.grouped_decode_forward): the same heads in order, reshaped."""
    cfg, params = lm.cfg, lm.params
    idx = np.asarray(list(ids), dtype=np.int64)[None, :]
    T = idx.shape[1]
    residuals: list[np.ndarray] = []
    attention: dict[int, np.ndarray] = {}

    def observe(h: np.ndarray, block: BlockCache | None) -> None:
        layer = len(residuals) - 1  # the block whose output h is
        if block is not None and layer in layers:
            attention[layer] = block.attn.core.a[0].reshape(cfg.n_head, T, T)
        residuals.append(h[0])

    gpt_forward(params, cfg, idx, cache=new_cache(cfg, 1, T, lm.dtype), observe=observe)
    _, w_head, b_head = token_tables(params)

    def lens(h: np.ndarray) -> np.ndarray:
        normed, _ = norm_forward(cfg.norm, h, params, "ln_f.", cfg.ln_eps)
        logits = linear_forward(normed, w_head, b_head)[0]
        return softcap_forward(logits, cfg.logit_softcap)[0]

    embed = POSITIONS[cfg.pos_encoding].embed_forward
    positions = None if embed is None else embed(params, cfg, slice(0, T), lm.dtype)[0]
    return Trace(attention, residuals, lens, positions, tuple(lm.never_generate))

"""The NumPy engine's side of looking inside a model (sheepop.arch.inspection): one forward pass
over the prompt, through a KV cache of its own (so no layer's cache outlives its layer), that
keeps the residual stream and the attention weights of the layers asked, read at the engine's
hook points (sheepop.scratch.hooks; docs/hooks.md).

    A_l = softmax(Q K^T / sqrt(d_k) + M)     blocks.l.attn.pattern
    h_0, h_1 .. h_L                          embed, then each blocks.l.resid_out
    lens(h) = Norm_f(h) W_head^T (+ b)       the model's own final norm and head
    never                                    the ids its sampler never draws
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np

from sheepop.arch.inspection import Trace
from sheepop.scratch.gpt import gpt_forward, new_cache, token_tables
from sheepop.scratch.hooks import hooked
from sheepop.scratch.layers import linear_forward
from sheepop.scratch.lm import NumpyLM
from sheepop.scratch.norm import norm_forward
from sheepop.scratch.positions import POSITIONS
from sheepop.scratch.softcap import softcap_forward


def trace(lm: NumpyLM, ids: Sequence[int], layers: Collection[int]) -> Trace:
    """The `Trace` of one prompt (at most block_size tokens), with the attention weights of
    `layers`."""
    cfg, params = lm.cfg, lm.params
    idx = np.asarray(list(ids), dtype=np.int64)[None, :]
    T = idx.shape[1]
    residuals: list[np.ndarray] = []
    attention: dict[int, np.ndarray] = {}
    keep = lambda h, point: residuals.append(h[0])  # noqa: E731
    hooks = {"embed": keep, **{f"blocks.{i}.resid_out": keep for i in range(cfg.n_layer)}}
    for layer in layers:
        hooks[f"blocks.{layer}.attn.pattern"] = (
            lambda a, point, layer=layer: attention.__setitem__(layer, a[0]))
    with hooked(cfg, hooks):
        gpt_forward(params, cfg, idx, cache=new_cache(cfg, 1, T, lm.dtype), last_only=True)
    _, w_head, b_head = token_tables(params)

    def lens(h: np.ndarray) -> np.ndarray:
        normed, _ = norm_forward(cfg.norm, h, params, "ln_f.", cfg.ln_eps)
        logits = linear_forward(normed, w_head, b_head)[0]
        return softcap_forward(logits, cfg.logit_softcap)[0]

    embed = POSITIONS[cfg.pos_encoding].embed_forward
    positions = None if embed is None else embed(params, cfg, slice(0, T), lm.dtype)[0]
    return Trace(attention, residuals, lens, positions, tuple(lm.never_generate))

"""The torch engine's side of looking inside a model (sheepop.arch.inspection): one forward pass
over the prompt that keeps the residual stream and the attention weights of the layers asked,
read at the engine's hook points (sheepop.model.hooks; docs/hooks.md).

    A_l = softmax(Q K^T / sqrt(d_k) + M)     blocks.l.attn.pattern, hooked in every layer and
                                             kept for those asked: every layer takes the explicit
                                             masked-softmax path whichever are asked
    h_0, h_1 .. h_L                          embed, then each blocks.l.resid_out (with
                                             model.unet_skips a block's input is not the output
                                             before it: h_l is the stream leaving block l)
    lens(h) = Norm_f(h) W_head^T (+ b)       the model's own final norm and head
    never                                    the ids its sampler never draws
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np
import torch

from sheepop.arch.inspection import Trace
from sheepop.model.hooks import hooked
from sheepop.model.lm import TorchLM
from sheepop.model.softcap import softcap


def _numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().cpu().numpy()


def trace(lm: TorchLM, ids: Sequence[int], layers: Collection[int]) -> Trace:
    """The `Trace` of one prompt (at most block_size tokens), without a KV cache, with the
    attention weights of `layers`."""
    model = lm.model
    idx = torch.tensor([list(ids)], dtype=torch.long, device=lm.device)
    residuals: list[torch.Tensor] = []
    attention: dict[int, torch.Tensor] = {}
    keep = lambda h, point: residuals.append(h[0])  # noqa: E731
    hooks = {"embed": keep, **{f"blocks.{i}.resid_out": keep for i in range(len(model.blocks))}}
    # a hook at every layer's pattern, kept for the layers asked: the explicit path in every
    # layer whichever are asked (none too), so that the lens and the logits do not depend on it
    for layer in range(len(model.blocks)):
        hooks[f"blocks.{layer}.attn.pattern"] = (
            lambda a, point, layer=layer: attention.__setitem__(layer, a[0])
            if layer in layers else None)
    with torch.inference_mode(), hooked(model, hooks):
        model(idx, last_only=True)
        positions = None
        if model.cfg.pos_encoding != "rope":  # P[t]: what `embed` adds to a zero embedding
            zeros = torch.zeros(1, idx.shape[1], model.cfg.n_embd, device=lm.device,
                                dtype=model.tok_emb.weight.dtype)
            positions = _numpy(model.pos_emb.embed(zeros, slice(0, idx.shape[1]))[0])
    dtype = model.tok_emb.weight.dtype

    def lens(h: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            x = torch.from_numpy(h).to(device=lm.device, dtype=dtype)
            return _numpy(softcap(model.head(model.ln_f(x), model.tok_emb.table()),
                                  model.cfg.logit_softcap))

    return Trace({i: _numpy(a) for i, a in attention.items()},
                 [_numpy(h) for h in residuals], lens,
                 positions, tuple(lm.never_generate))

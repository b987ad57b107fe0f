"""The torch engine's side of looking inside a model (sheepop.arch.inspect): one forward pass
over the prompt that keeps the residual stream and the attention weights of the layers asked.

    A_l = softmax(Q K^T / sqrt(d_k) + M)     GPT.forward(attention_of=layers): the explicit
                                             masked-softmax path, those layers' weights kept
    h_0 .. h_{L-1}, h_L                      the inputs of each block and of the final norm
                                             (forward pre-hooks: the model is not changed)
    lens(h) = Norm_f(h) W_head^T (+ b)       the model's own final norm and head
    never                                    the ids its sampler never draws
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np
import torch

from sheepop.arch.inspect import Trace
from sheepop.model.gpt import softcap
from sheepop.model.lm import TorchLM


def _numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().float().cpu().numpy()


def trace(lm: TorchLM, ids: Sequence[int], layers: Collection[int]) -> Trace:
    """The `Trace` of one prompt (at most block_size tokens), without a KV cache, with the
    attention weights of `layers`."""
    model = lm.model
    idx = torch.tensor([list(ids)], dtype=torch.long, device=lm.device)
    residuals: list[torch.Tensor] = []
    keep = lambda module, args: residuals.append(args[0])  # noqa: E731
    hooks = [m.register_forward_pre_hook(keep) for m in (*model.blocks, model.ln_f)]
    try:
        with torch.inference_mode():
            _, _, attention = model(idx, attention_of=layers)
            positions = None
            if model.cfg.pos_encoding != "rope":  # P[t]: what `embed` adds to a zero embedding
                zeros = torch.zeros(1, idx.shape[1], model.cfg.n_embd, device=lm.device,
                                    dtype=model.tok_emb.weight.dtype)
                positions = _numpy(model.pos_emb.embed(zeros, slice(0, idx.shape[1]))[0])
    finally:
        for hook in hooks:
            hook.remove()
    dtype = model.tok_emb.weight.dtype

    def lens(h: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            x = torch.from_numpy(h).to(device=lm.device, dtype=dtype)
            return _numpy(softcap(model.head(model.ln_f(x), model.tok_emb.table()),
                                  model.cfg.logit_softcap))

    return Trace({i: _numpy(a[0]) for i, a in attention.items()},
                 [_numpy(h[0]) for h in residuals], lens,
                 positions, tuple(lm.never_generate))

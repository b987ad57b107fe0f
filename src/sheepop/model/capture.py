"""The torch engine's side of looking inside a model (sheepop.arch.inspection): one forward pass
over the prompt that keeps the residual stream and the attention weights of the layers asked.

    A_l = softmax(Q K^T / sqrt(d_k) + M)     GPT.forward(attention_of=layers): the explicit
                                             masked-softmax path, those layers' weights kept
    h_0, h_1 .. h_L                          block 0's input, then each block's output
                                             (forward hooks: the model is not changed)
    lens(h) = Norm_f(h) W_head^T (+ b)       the model's own final norm and head
    never                                    the ids its sampler never draws
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np
import torch

from sheepop.arch.inspection import Trace
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
    # h_0 (block 0's input), then each block's output: with model.unet_skips a block's input is
    # not the output before it (the skip is added between), and h_l is the stream leaving
    # block l in both engines (sheepop.scratch.capture: gpt_forward's `observe`)
    hooks = [model.blocks[0].register_forward_pre_hook(lambda m, args: residuals.append(args[0]))]
    hooks += [b.register_forward_hook(lambda m, args, out: residuals.append(out[0]))
              for b in model.blocks]
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

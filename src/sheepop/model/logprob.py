"""The log-probability of given target tokens, per token, in the torch engine: autograd takes
its backward (the NumPy engine's is written out in sheepop.scratch.logprob, with the derivation:
dL/dz_t = g_t (onehot(y_t) - softmax(z_t)), g_t = dL/dlogp_t)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from sheepop.arch import IGNORE_INDEX


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """logp_t = log softmax(z_t)[y_t] (targets' shape, float32 at least) where y_t counts, 0
    where it is IGNORE_INDEX. Half-precision logits are promoted to float32 first, as the
    cross-entropy's are."""
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    counted = targets != IGNORE_INDEX
    picked = F.log_softmax(logits, dim=-1).gather(
        -1, torch.where(counted, targets, 0).unsqueeze(-1)).squeeze(-1)
    return torch.where(counted, picked, torch.zeros_like(picked))

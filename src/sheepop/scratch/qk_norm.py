"""QK-norm: each head's query and key vectors RMS-normalised before RoPE (model.qk_norm).

    q <- q / sqrt(mean(q^2) + eps),   k <- k / sqrt(mean(k^2) + eps)      over d_k, no gain

A score q . k / sqrt(d_k) then lies within +-sqrt(d_k) whatever the weights do, so no logit of
the attention can run away and saturate its softmax (modded-nanogpt; OLMo 2 and Qwen 3 add a
gain). It is RMSNorm without its gain (sheepop.scratch.norm: the same forward and backward,
docs/derivations/rmsnorm.md) applied to the queries and keys stacked on the head axis, so it
composes with the rotation the attention already takes (`Rotation`): normalise, then turn,
and back through both in reverse. The torch engine's form is in sheepop.model.attention.
"""

from __future__ import annotations

import numpy as np

from sheepop.scratch.attention import Rotation
from sheepop.scratch.norm import rmsnorm_backward, rmsnorm_forward


def with_qk_norm(rotate: Rotation | None, eps: float) -> Rotation:
    """The attention's query/key transform: RMS-normalise each head's vector, then `rotate`
    (RoPE; None: no rotation). forward(qk) -> (qk, cache), backward(dqk, cache) -> dqk."""

    def forward(qk: np.ndarray):
        normed, norm = rmsnorm_forward(qk, qk.dtype.type(1.0), eps)
        if rotate is None:
            return normed, (norm, None)
        turned, rotation = rotate[0](normed)
        return turned, (norm, rotation)

    def backward(dqk: np.ndarray, cache) -> np.ndarray:
        norm, rotation = cache
        if rotate is not None:
            dqk = rotate[1](dqk, rotation)
        return rmsnorm_backward(dqk, norm)[0]  # (no gain: its gradient is not wanted)

    return forward, backward

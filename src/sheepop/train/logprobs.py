"""Training on a function of the model's per-token log-probabilities (DPO, RL): the contract
both engines keep (`token_logprobs`, `logprob_step` of sheepop.train.engine_torch and
engine_numpy).

A batch is (x, y) as the chat template makes it: y_t the target after x_<=t where it counts,
IGNORE_INDEX elsewhere (the prompt, the padding). The engine gives

    logp[b, t] = log pi(y_bt | x_b,<=t)      (B, T) float64, 0 where y is IGNORE_INDEX

and a loss is any function of it that also returns its derivative:

    loss_of(i, logp) -> (L_i, dL_i/dlogp)    i: which batch of the step

The step adds the gradients of every L_i (so each L_i is already scaled to the step's mean),
clips, and updates; the torch engine back-propagates dL/dlogp through autograd
(sum_t g_t logp_t, a vector-Jacobian product), the NumPy engine through its hand-written
backward (sheepop.scratch.logprob: dL/dz_t = g_t (onehot(y_t) - softmax(z_t))). The loss itself
is written once, engine-neutral, with its derivative checked against finite differences and
autograd (docs/derivations/dpo.md).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

LossOfLogprobs = Callable[[int, np.ndarray], tuple[float, np.ndarray]]


def sequence_logprobs(logp: np.ndarray) -> np.ndarray:
    """log pi(answer) = sum_t logp_t over the counted tokens of each row (B,): the masked
    positions hold 0, so the plain sum is the masked one."""
    return np.asarray(logp, np.float64).sum(axis=-1)

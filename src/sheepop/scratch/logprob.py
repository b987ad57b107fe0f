"""The log-probability of given target tokens, per token, and its backward: the unit that DPO and
RL train through (docs/derivations/dpo.md, "The gradient through the model").

For the logits z_t (V) at position t and its target y_t,

    logp_t = log softmax(z_t)[y_t] = z_t[y_t] - log sum_j exp z_t[j]

and, with p_t = softmax(z_t), d(log sum_j exp z_t[j]) / dz_t[j] = p_t[j], so

    d logp_t / dz_t[j] = [j = y_t] - p_t[j]

A loss L(logp) of the per-token log-probabilities (DPO's logistic loss of sequence sums, GRPO's
advantage-weighted token mean: any function) reaches the logits through g_t = dL/dlogp_t:

    dL/dz_t = g_t (onehot(y_t) - p_t)

This is the cross-entropy's backward with a weight per token: the mean cross-entropy is
L = -(1/N) sum_t logp_t, so g_t = -1/N and dL/dz_t = (p_t - onehot(y_t)) / N, the familiar
(P - Y) / N (docs/derivations/head-and-loss.md). A position whose target is IGNORE_INDEX (the
prompt and the padding: the chat template's loss mask) has logp_t = 0 and no gradient, whatever
g_t says.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from sheepop.arch import IGNORE_INDEX


class LogprobCache(NamedTuple):
    probs: np.ndarray     # (N, V) softmax of the logits, the positions flattened
    targets: np.ndarray   # (N,)
    counted: np.ndarray   # (N,) bool: target != IGNORE_INDEX
    shape: tuple[int, ...]  # the logits' shape


def token_logprob_forward(logits: np.ndarray, targets: np.ndarray
                          ) -> tuple[np.ndarray, LogprobCache]:
    """logp (targets' shape, float64): log softmax(z_t)[y_t] where y_t counts, 0 elsewhere.
    Computed as z_t[y_t] - max z_t - log sum_j exp(z_t[j] - max z_t), so a token far below the
    others has a finite log-probability even where its probability underflows."""
    V = logits.shape[-1]
    z = logits.reshape(-1, V)
    y = np.asarray(targets).reshape(-1)
    counted = y != IGNORE_INDEX
    shifted = z - z.max(axis=-1, keepdims=True)
    probs = np.exp(shifted)
    sums = probs.sum(axis=-1, keepdims=True)
    probs /= sums
    rows = np.flatnonzero(counted)
    logp = np.zeros(len(y), np.float64)
    logp[rows] = shifted[rows, y[rows]].astype(np.float64) - np.log(sums[rows, 0],
                                                                    dtype=np.float64)
    return logp.reshape(np.shape(targets)), LogprobCache(probs, y, counted, logits.shape)


def token_logprob_backward(dlogp: np.ndarray, cache: LogprobCache) -> np.ndarray:
    """dL/dz = g_t (onehot(y_t) - p_t) with g = dL/dlogp (targets' shape), in the logits'
    dtype; 0 at positions that do not count."""
    probs, y, counted, shape = cache
    g = np.where(counted, np.asarray(dlogp, np.float64).reshape(-1), 0.0).astype(probs.dtype)
    dz = probs * -g[:, None]
    rows = np.flatnonzero(counted)
    dz[rows, y[rows]] += g[rows]
    return dz.reshape(shape)

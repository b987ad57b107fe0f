"""The DPO loss of a batch of preference pairs and its gradient, engine-neutral (NumPy, float64):
docs/derivations/dpo.md derives it from the KL-regularised reward objective.

For pair i, with log pi(.) the policy's log-probability of an answer (the sum of its counted
tokens' log-probabilities) and log pi_ref(.) the reference's, computed once before training,

    r_c = beta (log pi(c) - log pi_ref(c))       the implicit reward of the chosen answer
    r_r = beta (log pi(r) - log pi_ref(r))       and of the rejected one
    u   = r_c - r_r                              the reward margin
    L   = (1/N) sum_i -log sigma(u_i) = (1/N) sum_i softplus(-u_i)

and, since d softplus(-u)/du = -sigma(-u),

    dL/d log pi(c_i) =  -(beta / N) sigma(-u_i)
    dL/d log pi(r_i) =  +(beta / N) sigma(-u_i)

each spread over the answer's tokens unchanged (d log pi(c) / d logp_t = 1 for a counted token),
the g_t that the engines' `logprob_step` back-propagates (sheepop.train.logprobs). A pair the
policy already ranks far apart (u >> 0) has sigma(-u) ~ 0 and pulls no more; one it ranks the
wrong way pulls with up to beta / N.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class PairLosses(NamedTuple):
    loss: float            # L, the mean over the pairs
    margins: np.ndarray    # u_i (N,)
    d_chosen: np.ndarray   # dL/d log pi(c_i) (N,)
    d_rejected: np.ndarray  # dL/d log pi(r_i) (N,)


def dpo_loss(chosen: np.ndarray, rejected: np.ndarray, ref_chosen: np.ndarray,
             ref_rejected: np.ndarray, beta: float, n: int | None = None) -> PairLosses:
    """L = (1/n) sum_i softplus(-u_i), u_i = beta [(log pi(c_i) - log pi_ref(c_i)) -
    (log pi(r_i) - log pi_ref(r_i))], over the pairs given (n: the step's whole count of pairs
    when these are a part of it; default their own count), and its gradient (the docstring)."""
    chosen, rejected = np.asarray(chosen, np.float64), np.asarray(rejected, np.float64)
    u = beta * ((chosen - ref_chosen) - (rejected - ref_rejected))
    n = len(u) if n is None else n
    loss = float(np.logaddexp(0.0, -u).sum() / n)
    pull = beta * np.exp(-np.logaddexp(0.0, u)) / n  # beta sigma(-u) / n, without overflow
    return PairLosses(loss, u, -pull, pull)


def reward_accuracy(margins: np.ndarray) -> float:
    """The share of pairs whose chosen answer has the higher implicit reward (u > 0)."""
    return float(np.mean(np.asarray(margins) > 0)) if len(margins) else float("nan")

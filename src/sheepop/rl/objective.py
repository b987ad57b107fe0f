"""The policy-gradient loss of `sheepop rl` as a function of per-token log-probabilities, with
its gradient written out (docs/derivations/policy-gradient.md derives each term).

For sampled answers i with advantages A_i (sheepop.rl.groups), the answer tokens t of each
(mask m_it = 1), the policy's log-probabilities logp_it, the sampling policy's old_it and the
starting model's ref_it, with M = sum m_it the answer tokens of the whole batch:

    rho_it = exp(logp_it - old_it)                                  the importance ratio
    s_it   = min(rho_it A_i, clip(rho_it, 1 - eps, 1 + eps) A_i)     the clipped surrogate
    r_it   = ref_it - logp_it                                       log pi_ref / pi
    k1 = -r,   k2 = r^2 / 2,   k3 = e^r - 1 - r                     per-token KL estimators

    L = (1/M) sum_it m_it (-s_it + beta k(r_it))                    the token-level mean
                                                                    (GRPO/DAPO)

and its gradient, what an engine backpropagates through the log-probabilities
(sheepop.scratch.logprob: dL/dz_t = g_t (onehot(y_t) - p_t)):

    dL/dlogp_it = (m_it / M) (-A_i rho_it [the ratio is not clipped] + beta k'(r_it))
    k1' = 1,   k2' = -r,   k3' = 1 - e^r

"Not clipped": the min takes its first term, i.e. not (A > 0 and rho > 1 + eps) and not
(A < 0 and rho < 1 - eps); a clipped term is a constant. On the first update of a batch the
policy is the sampling policy (old = logp), so rho = 1 and the gradient is REINFORCE's,
-(m / M) A. Everything is float64: the loss is a sum of small terms over every answer token.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class PolicyLoss:
    """The settings of the loss: `clip` eps, `kl` beta and its `estimator`."""
    clip: float = 0.2
    kl: float = 0.0
    estimator: str = "k3"


@dataclass
class Objective:
    loss: float
    grad: np.ndarray     # dL/dlogp, the log-probabilities' shape (0 outside the mask)
    kl: float            # the mean k3 estimate of KL(pi || pi_ref) per answer token (0: no ref)
    clipped: float       # the share of answer tokens whose ratio was clipped
    surprisal: float     # the mean -logp of the answer tokens (their entropy, estimated)


def kl_terms(r: np.ndarray, estimator: str) -> tuple[np.ndarray, np.ndarray]:
    """(k(r), dk/dlogp) per token for r = ref - logp (so dr/dlogp = -1)."""
    if estimator == "k1":
        return -r, np.ones_like(r)
    if estimator == "k2":
        return 0.5 * r * r, -r
    if estimator == "k3":
        e = np.exp(r)
        return e - 1.0 - r, 1.0 - e
    raise ValueError(f"unknown KL estimator {estimator!r}")


def policy_objective(logp: np.ndarray, mask: np.ndarray, advantages: np.ndarray,
                     settings: PolicyLoss, old_logp: np.ndarray | None = None,
                     ref_logp: np.ndarray | None = None, tokens: int | None = None
                     ) -> Objective:
    """L and dL/dlogp for log-probabilities `logp` (N, T) of the answer tokens (`mask`),
    sequence advantages (N,), the sampling policy's `old_logp` (None: this policy's, ratio 1)
    and the reference's `ref_logp` (None: no KL term; needed when settings.kl > 0). `tokens`:
    M, the answer tokens of the whole step when these rows are a part of it (default: the
    mask's), so that the parts' losses and gradients add up to the whole batch's."""
    logp = np.asarray(logp, np.float64)
    m = np.asarray(mask, bool)
    M = max(int(m.sum()) if tokens is None else tokens, 1)
    A = np.broadcast_to(np.asarray(advantages, np.float64)[:, None], logp.shape)
    old = logp if old_logp is None else np.asarray(old_logp, np.float64)
    rho = np.exp(np.where(m, logp - old, 0.0))
    low, high = 1.0 - settings.clip, 1.0 + settings.clip
    surrogate = np.minimum(rho * A, np.clip(rho, low, high) * A)
    clipped = ((A > 0) & (rho > high)) | ((A < 0) & (rho < low))
    loss_terms = -surrogate
    dlogp = -A * rho * ~clipped
    kl = 0.0
    if ref_logp is not None:
        r = np.where(m, np.asarray(ref_logp, np.float64) - logp, 0.0)
        k, dk = kl_terms(r, settings.estimator)
        loss_terms = loss_terms + settings.kl * k
        dlogp = dlogp + settings.kl * dk
        kl = float((np.exp(r) - 1.0 - r)[m].sum() / M)
    elif settings.kl > 0:
        raise ValueError("a KL term needs the reference's log-probabilities")
    return Objective(float(loss_terms[m].sum() / M), np.where(m, dlogp / M, 0.0), kl,
                     float(clipped[m].sum() / M), float(-logp[m].sum() / M))

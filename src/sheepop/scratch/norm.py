"""Normalisation layers of the NumPy engine, one per `model.norm` kind, forward and backward.

    layernorm   y = gamma * (x - mu) / sqrt(var + eps) + beta   (mu, biased var over features)
    rmsnorm     y = gamma * x / sqrt(mean(x^2) + eps)            (no centring, no shift)

A kind is a `Norm`: the names of its parameters (each a vector of width d, stored under the
layer's prefix, e.g. `blocks.0.ln1.weight`), `forward(x, *params, eps) -> (y, cache)` and
`backward(dy, cache) -> (dx, *dparams)` in the same order. The torch engine's units are in
sheepop/model/norm.py; the derivations in docs/derivations/layernorm.md and
docs/derivations/rmsnorm.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np


def mean_square(x: np.ndarray) -> np.ndarray:
    """mean(x^2) over the last axis, kept as an axis of 1: x . x / d, one dot product per row
    (a decode step normalises single rows, where every array operation saved counts: x * x
    then a sum is two, and a temporary as wide as x)."""
    return np.vecdot(x, x)[..., None] / x.shape[-1]


# --- LayerNorm over the last axis, biased variance ---------------------------------------------
class LayerNormCache(NamedTuple):
    xhat: np.ndarray   # (x - mu) * rstd
    rstd: np.ndarray   # 1 / sqrt(var + eps), shape (..., 1)
    gamma: np.ndarray


def layernorm_moments(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mu, x - mu, var) over the last axis, mu = sum / d and var = mean((x - mu)^2) kept as
    axes of 1."""
    mu = x.sum(axis=-1, keepdims=True) / x.shape[-1]
    xc = x - mu
    return mu, xc, mean_square(xc)


def layernorm_forward(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float
                      ) -> tuple[np.ndarray, LayerNormCache]:
    """y = gamma * (x - mu) / sqrt(var + eps) + beta; mu, var (biased) over the last axis
    (docs/derivations/layernorm.md). Means are sum / d, np.mean's arithmetic without its
    Python wrapper (a decode step normalises single rows, where the wrapper costs as much as
    the sum)."""
    mu, xc, var = layernorm_moments(x)
    rstd = 1.0 / np.sqrt(var + eps)
    xhat = xc
    xhat *= rstd
    y = xhat * gamma
    y += beta
    return y, LayerNormCache(xhat, rstd, gamma)


def layernorm_backward(dout: np.ndarray, cache: LayerNormCache
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * gamma (mean over features);
    dgamma = sum dy * xhat, dbeta = sum dy over every row."""
    xhat, rstd, gamma = cache
    d = xhat.shape[-1]
    g = dout * gamma
    dx = g - g.mean(axis=-1, keepdims=True)
    dx -= xhat * (np.einsum("...i,...i->...", g, xhat)[..., None] / d)
    dx *= rstd
    dgamma = np.einsum("ni,ni->i", dout.reshape(-1, d), xhat.reshape(-1, d))
    dbeta = dout.reshape(-1, d).sum(axis=0)
    return dx, dgamma, dbeta


class RMSNormCache(NamedTuple):
    xhat: np.ndarray   # x * rstd
    rstd: np.ndarray   # 1 / sqrt(mean(x^2) + eps), shape (..., 1)
    gamma: np.ndarray


def rmsnorm_forward(x: np.ndarray, gamma: np.ndarray, eps: float
                    ) -> tuple[np.ndarray, RMSNormCache]:
    """y = gamma * x / sqrt(mean(x^2) + eps), the mean over the last axis
    (docs/derivations/rmsnorm.md)."""
    rstd = 1.0 / np.sqrt(mean_square(x) + eps)
    xhat = x * rstd
    return xhat * gamma, RMSNormCache(xhat, rstd, gamma)


def rmsnorm_backward(dout: np.ndarray, cache: RMSNormCache) -> tuple[np.ndarray, np.ndarray]:
    """dx = rstd * (g - xhat * mean(g * xhat)), g = dy * gamma (mean over features): LayerNorm's
    backward without the mean(g) term, since no mean was subtracted; dgamma = sum dy * xhat."""
    xhat, rstd, gamma = cache
    d = xhat.shape[-1]
    g = dout * gamma
    dx = g - xhat * (np.einsum("...i,...i->...", g, xhat)[..., None] / d)
    dx *= rstd
    dgamma = np.einsum("ni,ni->i", dout.reshape(-1, d), xhat.reshape(-1, d))
    return dx, dgamma


class Norm(NamedTuple):
    params: tuple[str, ...]
    forward: Callable
    backward: Callable
    moments: Callable[[np.ndarray], tuple[np.ndarray | None, np.ndarray]]
    """x -> (the mean subtracted, or None; the variance or mean square divided by): the
    statistics the page's step view shows (sheepop.scratch.token_steps)."""


NORMS = {"layernorm": Norm(("weight", "bias"), layernorm_forward, layernorm_backward,
                           lambda x: layernorm_moments(x)[::2]),
         "rmsnorm": Norm(("weight",), rmsnorm_forward, rmsnorm_backward,
                         lambda x: (None, mean_square(x)))}


def norm_forward(kind: str, x: np.ndarray, params: dict[str, np.ndarray], prefix: str,
                 eps: float) -> tuple[np.ndarray, tuple[str, object]]:
    """The norm `kind` with its parameters read from `params` under `prefix` ("blocks.0.ln1.")."""
    return NORMS[kind].forward(x, *(params[prefix + n] for n in NORMS[kind].params), eps)


def norm_backward(kind: str, dout: np.ndarray, cache: object, prefix: str
                  ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """dx and the gradients keyed by full parameter name."""
    dx, *dparams = NORMS[kind].backward(dout, cache)
    return dx, {prefix + n: g for n, g in zip(NORMS[kind].params, dparams)}

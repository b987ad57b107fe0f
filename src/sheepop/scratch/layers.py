"""The elementary layers of the GPT, each a forward/backward pair with an explicit cache.

Embedding, linear, activations, dropout and the loss live here; the layer kinds the config
chooses between are units of their own (positions.py, norm.py, ffn.py, attention.py).

Convention (as in llm.c): `*_forward(inputs, params) -> out, cache` keeps in `cache` exactly
what the backward pass needs; `*_backward(dout, cache) -> (d_inputs..., d_params...)` gets
dL/d(out) and returns dL/d(each input) and dL/d(each parameter), nothing accumulated. Shapes: a
leading batch part (B, T) or (N,) is written `...`; d is the feature width. Arrays stay in the
dtype they come in (float32 or float64). The derivations: docs/derivations/embedding.md (the
lookup), mlp.md (linear, the activations, dropout), swiglu.md (SiLU), head-and-loss.md
(softmax cross-entropy), all under docs/derivations/.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from sheepop.arch import IGNORE_INDEX
from sheepop.scratch.special import chunks, normal_cdf, normal_pdf


# --- embedding: out[..., :] = E[idx[...], :] -------------------------------------------------
class EmbeddingCache(NamedTuple):
    idx: np.ndarray
    vocab_size: int


def embedding_forward(idx: np.ndarray, table: np.ndarray) -> tuple[np.ndarray, EmbeddingCache]:
    """out = E[idx]: row lookup, (...,) int -> (..., d)."""
    return table[idx], EmbeddingCache(idx, table.shape[0])


def embedding_backward(dout: np.ndarray, cache: EmbeddingCache) -> np.ndarray:
    """dE[v] = sum of dout over every position whose token is v (a scatter-add;
docs/derivations/embedding.md)."""
    d = dout.shape[-1]
    dtable = np.zeros((cache.vocab_size, d), dtype=dout.dtype)
    np.add.at(dtable, cache.idx.reshape(-1), dout.reshape(-1, d))
    return dtable


# --- linear: y = x W^T + b, W of shape (out, in) --------------------------------------------
class LinearCache(NamedTuple):
    x: np.ndarray
    w: np.ndarray
    has_bias: bool


def linear_forward(x: np.ndarray, w: np.ndarray, b: np.ndarray | None
                   ) -> tuple[np.ndarray, LinearCache]:
    """y = x W^T + b for x (..., in), W (out, in), b (out,) or None."""
    x2 = x.reshape(-1, x.shape[-1])
    y = x2 @ w.T
    if b is not None:
        y += b
    return y.reshape(*x.shape[:-1], w.shape[0]), LinearCache(x, w, b is not None)


def linear_backward(dout: np.ndarray, cache: LinearCache
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """dx = dy W, dW = dy^T x (summed over every row), db = sum of dy over rows (None without
    a bias)."""
    x, w = cache.x, cache.w
    dy2 = dout.reshape(-1, w.shape[0])
    dx = (dy2 @ w).reshape(x.shape)
    dw = dy2.T @ x.reshape(-1, w.shape[1])
    db = dy2.sum(axis=0) if cache.has_bias else None
    return dx, dw, db


def linear_grads(dout: np.ndarray, cache: LinearCache, name: str
                 ) -> tuple[np.ndarray, dict[str, np.ndarray | None]]:
    """dx and the layer's gradients keyed `{name}.weight`, `{name}.bias` (None when absent)."""
    dx, dw, db = linear_backward(dout, cache)
    return dx, {f"{name}.weight": dw, f"{name}.bias": db}


# --- activations ---------------------------------------------------------------------------
class GeluCache(NamedTuple):
    x: np.ndarray
    cdf: np.ndarray  # Phi(x), reused by the backward


def gelu_forward(x: np.ndarray) -> tuple[np.ndarray, GeluCache]:
    """GELU(x) = x * Phi(x), Phi the standard normal CDF (the exact, erf form;
    docs/derivations/mlp.md)."""
    cdf = normal_cdf(x)
    return x * cdf, GeluCache(x, cdf)


def gelu_backward(dout: np.ndarray, cache: GeluCache) -> np.ndarray:
    """GELU'(x) = Phi(x) + x * phi(x), phi the standard normal density."""
    x, cdf = cache
    grad = np.empty_like(x)
    flat = grad.reshape(-1)
    x, cdf, dout = x.reshape(-1), cdf.reshape(-1), dout.reshape(-1)
    for piece in chunks(flat.size):  # cache-sized pieces: the same formula, less memory traffic
        g = x[piece] * normal_pdf(x[piece])
        g += cdf[piece]
        g *= dout[piece]
        flat[piece] = g
    return grad


GELU_TANH_C = math.sqrt(2.0 / math.pi)
GELU_TANH_A = 0.044715


def gelu_tanh_forward(x: np.ndarray) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """GELU_tanh(x) = x/2 * (1 + tanh(u)), u = sqrt(2/pi) * (x + 0.044715 x^3)."""
    th = np.tanh(GELU_TANH_C * (x + GELU_TANH_A * x * x * x))
    return 0.5 * x * (1.0 + th), (x, th)


def gelu_tanh_backward(dout: np.ndarray, cache: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """d/dx = (1 + tanh u)/2 + x/2 * (1 - tanh^2 u) * sqrt(2/pi) * (1 + 3 * 0.044715 x^2)."""
    x, th = cache
    du = GELU_TANH_C * (1.0 + 3.0 * GELU_TANH_A * x * x)
    return dout * (0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * du)


def relu_forward(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ReLU(x) = max(x, 0); the cache is the mask x > 0."""
    mask = x > 0
    return x * mask, mask


def relu_backward(dout: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """ReLU'(x) = 1 where x > 0, else 0 (0 at x = 0, as torch)."""
    return dout * mask


def relu2_forward(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ReLU^2(x) = max(x, 0)^2 (Primer, So et al. 2021; modded-nanogpt's MLP); the cache is
    r = max(x, 0)."""
    r = np.maximum(x, 0)
    return r * r, r


def relu2_backward(dout: np.ndarray, r: np.ndarray) -> np.ndarray:
    """d/dx max(x, 0)^2 = 2 max(x, 0): continuous at 0 (where ReLU's is not), so 0 there."""
    return dout * (2 * r)


def silu_forward(x: np.ndarray) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """SiLU(x) = x * sigmoid(x) (the "swish"; docs/derivations/swiglu.md); the cache is x and
    sigmoid(x)."""
    sig = sigmoid(x)
    return x * sig, (x, sig)


def silu_backward(dout: np.ndarray, cache: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """SiLU'(x) = sigmoid(x) + x sigmoid(x) (1 - sigmoid(x)) = s (1 + x (1 - s))."""
    x, sig = cache
    return dout * sig * (1.0 + x * (1.0 - sig))


def sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + e^-x). Below x ~ -88 (float32; -709 in float64) e^-x overflows to inf and the
    quotient is 0, the function's own limit there: the overflow is expected and not reported.
    The form (1 + tanh(x/2)) / 2 is the same function without the overflow, and 1.6x slower."""
    s = np.negative(x)
    with np.errstate(over="ignore"):
        np.exp(s, out=s)
    s += 1.0
    return np.reciprocal(s, out=s)


ACTIVATIONS = {
    "gelu": (gelu_forward, gelu_backward),
    "silu": (silu_forward, silu_backward),
    "gelu_tanh": (gelu_tanh_forward, gelu_tanh_backward),
    "relu": (relu_forward, relu_backward),
    "relu2": (relu2_forward, relu2_backward),
}


# --- dropout (inverted): y = x * m / (1 - p), m ~ Bernoulli(1 - p) -----------------------------
def dropout_forward(x: np.ndarray, p: float, rng: np.random.Generator | None
                    ) -> tuple[np.ndarray, np.ndarray | None]:
    """Zero each element with probability p and scale the survivors by 1/(1-p); identity when
    p == 0 or rng is None (evaluation). The cache is the scaled mask m / (1 - p)."""
    if p == 0.0 or rng is None:
        return x, None
    mask = rng.random(x.shape, dtype=x.dtype) >= p
    scaled = mask * x.dtype.type(1.0 / (1.0 - p))
    return x * scaled, scaled


def dropout_backward(dout: np.ndarray, scaled_mask: np.ndarray | None) -> np.ndarray:
    """dx = dy * m / (1 - p): the same mask as the forward."""
    return dout if scaled_mask is None else dout * scaled_mask


# --- softmax + cross-entropy with ignored targets ------------------------------------------------
class CrossEntropyCache(NamedTuple):
    probs: np.ndarray    # softmax(z), (N, V)
    targets: np.ndarray  # (N,), IGNORE_INDEX where not counted
    counted: np.ndarray  # (N,) bool
    n: int               # number of counted targets
    shape: tuple[int, ...]


def cross_entropy_forward(logits: np.ndarray, targets: np.ndarray
                          ) -> tuple[float, CrossEntropyCache]:
    """L = (1/N) sum_{t: y_t != -1} (logsumexp(z_t) - z_t[y_t]), N the number of counted t
    (docs/derivations/head-and-loss.md)."""
    V = logits.shape[-1]
    z = logits.reshape(-1, V)
    y = targets.reshape(-1)
    counted = y != IGNORE_INDEX
    n = int(counted.sum())
    if n == 0:
        raise ValueError("cross-entropy over no targets: every target is IGNORE_INDEX")
    shifted = z - z.max(axis=-1, keepdims=True)  # exp never overflows; the result is unchanged
    probs = np.exp(shifted)
    sums = probs.sum(axis=-1, keepdims=True)
    probs /= sums
    rows = np.flatnonzero(counted)
    log_z = np.log(sums[rows, 0])
    loss = float(np.sum(log_z - shifted[rows, y[rows]], dtype=np.float64) / n)
    return loss, CrossEntropyCache(probs, y, counted, n, logits.shape)


def cross_entropy_backward(dloss: float, cache: CrossEntropyCache) -> np.ndarray:
    """dZ = dL * (P - Y) / N on counted rows (Y one-hot of the target), 0 on ignored rows."""
    probs, y, counted, n, shape = cache
    dz = probs.copy()
    rows = np.flatnonzero(counted)
    dz[rows, y[rows]] -= 1.0
    dz[~counted] = 0.0
    dz *= dz.dtype.type(dloss / n)
    return dz.reshape(shape)

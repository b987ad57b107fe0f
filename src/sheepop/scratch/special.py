"""The standard normal CDF Phi(x), vectorised, for the exact GELU (NumPy has no erf).

    Phi(x) = (1/2) erfc(-x / sqrt(2)),        phi(x) = Phi'(x) = exp(-x^2 / 2) / sqrt(2 pi)

erfc is evaluated for z = |x| / sqrt(2) >= 0 in the form

    erfc(z) = t * exp(-z^2 + f(t)),           t = 1 / (1 + z / 2)  in (0, 1]

where f is smooth on the whole of (0, 1] (it tends to log(1 / (2 sqrt(pi))) as z -> infinity),
so a Chebyshev polynomial in t approximates it closely. The coefficients are fitted once at
import, by least squares at Chebyshev nodes, to the standard library's `math.erfc`: there are no
magic constants to copy, and the accuracy is checked by test_normal_cdf_accuracy in
tests/scratch/test_scratch_model_grad.py:

- float64: degree 24, relative error of Phi ~1e-15 typically, 5e-14 at worst for |x| < 14
  (enough for gradient checks against torch at 1e-6);
- float32: degree 9 evaluated in float32, absolute error 2e-7 (float32's own resolution), at a
  fraction of the cost.

Writing erfc(z) rather than erf(z) keeps the *relative* accuracy of Phi(x) for very negative x,
where Phi is tiny and 1 + erf(x / sqrt 2) would cancel to nothing.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.polynomial import chebyshev

SQRT_HALF = math.sqrt(0.5)
INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def _fit(degree: int, z_max: float, nodes: int = 400) -> tuple[np.ndarray, float]:
    """Chebyshev coefficients of f(t) = log(erfc(z) / t) + z^2 on t in [t_min, 1]."""
    t_min = 1.0 / (1.0 + 0.5 * z_max)
    u = np.cos(np.pi * (np.arange(nodes) + 0.5) / nodes)  # Chebyshev nodes in [-1, 1]
    t = t_min + (1.0 - t_min) * (u + 1.0) / 2.0
    z = 2.0 * (1.0 / t - 1.0)
    f = np.array([math.log(math.erfc(zi) / ti) + zi * zi for zi, ti in zip(z, t)])
    return chebyshev.chebfit(u, f, degree), t_min


class _ErfcFit:
    """erfc on [0, z_max] for one dtype (fitted there; beyond it erfc is 0 to the dtype)."""

    def __init__(self, dtype: type, degree: int, z_max: float):
        coef, t_min = _fit(degree, z_max)
        self.dtype = np.dtype(dtype)
        self.z_max = z_max
        # Map t to u in [-1, 1] and convert to a plain polynomial in t for a short Horner loop;
        # for the low float32 degree the monomial form is well conditioned, for float64 we keep
        # the Chebyshev form and use Clenshaw's recurrence.
        self.use_monomial = degree <= 12
        if self.use_monomial:
            series = chebyshev.Chebyshev(coef, domain=[t_min, 1.0]).convert(
                kind=np.polynomial.Polynomial)
            self.coef = series.coef[::-1].astype(self.dtype)  # highest power first
        else:
            self.coef = coef.astype(self.dtype)
            self.scale = self.dtype.type(2.0 / (1.0 - t_min))
            self.shift = self.dtype.type(-2.0 * t_min / (1.0 - t_min) - 1.0)

    def __call__(self, z: np.ndarray) -> np.ndarray:
        """erfc(z) for z >= 0, same dtype as z. Overwrites z (a scratch buffer): every step
        works in place, to keep memory traffic low. Beyond z_max (t < t_min) the polynomial
        extrapolates a little, to a bounded value, while exp(-z^2) has underflowed to 0."""
        t = z * 0.5
        t += 1.0
        np.divide(1.0, t, out=t)
        if self.use_monomial:
            f = t * self.coef[0]
            for c in self.coef[1:-1]:
                f += c
                f *= t
            f += self.coef[-1]
        else:  # Clenshaw: sum_k c_k T_k(u)
            u = t * self.scale
            u += self.shift
            two_u = 2.0 * u
            b1, b2, spare = np.zeros_like(u), np.zeros_like(u), np.empty_like(u)
            for c in self.coef[:0:-1]:  # b_k = 2u b_{k+1} - b_{k+2} + c_k, three buffers
                np.multiply(two_u, b1, out=spare)
                spare -= b2
                spare += c
                b1, b2, spare = spare, b1, b2
            f = u * b1
            f -= b2
            f += self.coef[0]
        np.square(z, out=z)
        f -= z
        np.exp(f, out=f)
        f *= t
        return f


# Fitted up to z = 26, where erfc(z) ~ 1e-296 has all but underflowed even in float64.
_ERFC = {np.dtype(np.float64): _ErfcFit(np.float64, 24, 26.0),
         np.dtype(np.float32): _ErfcFit(np.float32, 9, 26.0)}


# Elementwise work runs over pieces of this many elements: a piece's handful of temporaries
# stays in the core's L2 cache instead of streaming every pass through memory (2-4x faster
# for the (B*T, 4d) activations of the FFN, most of all when other processes share the cache).
CHUNK = 32768


def chunks(n: int, size: int = CHUNK) -> list[slice]:
    """Consecutive slices covering range(n), each at most `size` long."""
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


def normal_cdf(x: np.ndarray) -> np.ndarray:
    """Phi(x) = erfc(-x / sqrt 2) / 2, computed as erfc(|x| / sqrt 2) and reflected."""
    x = np.asarray(x)
    if x.dtype not in _ERFC:
        x = x.astype(np.float64)
    out = np.empty_like(x)
    flat_x, flat_out = x.reshape(-1), out.reshape(-1)
    for piece in chunks(flat_x.size):
        flat_out[piece] = _normal_cdf(flat_x[piece])
    return out


def _normal_cdf(x: np.ndarray) -> np.ndarray:
    z = np.abs(x)
    # step(x) = [x > 0] as (1 + x / (|x| + tiny)) / 2: exactly 0 or 1 (1/2 at 0), and several
    # times faster than np.sign or a masked select on random signs (no branches). For subnormal
    # |x| it lies in between, harmlessly: it multiplies 1 - 2 Phi(-|x|) ~ 0.8 |x|.
    step = z + np.finfo(x.dtype).tiny
    np.divide(x, step, out=step)
    step += 1.0
    step *= 0.5
    z *= x.dtype.type(SQRT_HALF)
    cdf = _ERFC[x.dtype](z)  # erfc(|x| / sqrt 2) = 2 Phi(-|x|); z is now scratch space
    # Phi(x) = Phi(-|x|) + step(x) * (1 - 2 Phi(-|x|)): exactly Phi(-|x|) for x < 0, so the
    # left tail keeps its relative accuracy (1 - Phi(|x|) would cancel to 0).
    np.subtract(1.0, cdf, out=z)
    z *= step
    cdf *= 0.5
    cdf += z
    return cdf


def normal_pdf(x: np.ndarray) -> np.ndarray:
    """phi(x) = exp(-x^2 / 2) / sqrt(2 pi)."""
    pdf = np.square(x)
    pdf *= -0.5
    np.exp(pdf, out=pdf)
    pdf *= x.dtype.type(INV_SQRT_2PI)
    return pdf

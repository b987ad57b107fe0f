"""How far apart two float32 evaluations of one formula may be when only the order of their sums
differs: another CPU's vector width (AVX2 sums 8 lanes, AVX-512 16), another BLAS kernel or
blocking, another thread count, another memory layout of the same weights. A tolerance in a
test comes from here, from float32's precision and the computation's size, never from what one
machine printed (tests/README.md, "Float tolerances").

Float32 keeps 24 significant bits: its unit roundoff is u = 2^-24 (half of eps32 = 2^-23, the
spacing of float32 numbers at 1). A sum of n terms t_i, each addition rounded, in any order:

    |fl(sum t_i) - sum t_i| <= gamma_n sum |t_i|,   gamma_n = n u / (1 - n u)

(Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., 2002, eq. (3.5) for a dot
product), a bound every order meets and no order comes near: modelling each rounding error as
independent with mean zero, the error is at most

    gamma~_n(lambda) sum |t_i|,   gamma~_n(lambda) = exp(lambda sqrt(n) u + n u^2 / (1 - u)) - 1
                                                  ~ lambda sqrt(n) u

with probability at least 1 - 2 n exp(-lambda^2 (1 - u)^2 / 2) (Higham and Mary, "A New
Approach to Probabilistic Rounding Error Analysis", SIAM J. Sci. Comput. 41(5), 2019, the
bound for inner products). With lambda = 6 that is 1 - 1.2e-4 for a sum of 4,096 terms. Two
orders are each within it of the exact sum, so within
twice it of each other. An elementwise function (exp, log, tanh, erf, sqrt) differs between its
implementations by a few units in the last place, less than one such step.

A chain of `depth` steps (a layer's products, norms and functions, L layers of them) adds each
step's error to those carried from the steps before; a pre-norm block renormalises what it reads,
so a relative error of the residual stream is carried into the next products with a gain of
about 1. So the relative tolerance of a value at the end of the chain is `depth` times one
step's, relative to `magnitude`, the size of what is compared (its largest |value|: the terms'
sum sum |t_i| is larger where they cancel, which the factor lambda and the linear growth in depth,
where independent errors grow as sqrt(depth), leave room for).

What this does not cover: a formula computed differently (bf16 against float32, a quantized
weight against its float one); those tolerances come from that dtype's own rounding (2^-9 for a
bf16 result) and say so where they are set.
"""

from __future__ import annotations

import math

UNIT_ROUNDOFF = 2.0 ** -24
"""u of float32: |fl(x) - x| <= u |x| for every rounding to nearest."""

CONFIDENCE = 6.0
"""lambda of the probabilistic bound: it fails with probability under 3e-8 n for a sum of n."""


def float32_tolerance(n: int, depth: int = 1, magnitude: float = 1.0) -> float:
    """The largest |a - b| for two float32 evaluations of one computation that differ only in
    the order of their sums: `depth` steps in sequence, no sum longer than `n` terms, values of
    size `magnitude`:

        2 * depth * lambda * sqrt(n) * u * magnitude

    (the module's docstring derives it). `n` is the longest reduction on the way (the model's
    width, its feed-forward width, the context or the vocabulary); `depth` counts the steps
    from the inputs to the value compared."""
    if n < 1 or depth < 1:
        raise ValueError("n and depth count terms and steps: at least 1")
    return 2 * depth * CONFIDENCE * math.sqrt(n) * UNIT_ROUNDOFF * magnitude


STEPS_PER_BLOCK = 8
"""The steps of one transformer block in sequence, for `depth`: the attention's norm, the
query/key/value product, the scores, the weighted sum of the values, the output projection,
the feed-forward's norm, its first product (with its activation) and its second."""


def model_depth(n_layer: int) -> int:
    """The steps from the embedding to the logits of an n_layer model: every block's, then the
    final norm and the head."""
    return STEPS_PER_BLOCK * n_layer + 2

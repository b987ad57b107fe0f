"""From logits to the next token: the sampling rule shared by both engines.

    p = softmax((z - max z) / tau)               temperature tau > 0 (tau = 0: greedy argmax)
    top-k: keep the k largest p_i, zero the rest, renormalise
    top-p: sort p descending, keep the smallest prefix whose sum reaches p, renormalise
    min-p: keep the p_i >= m * max_j p_j, zero the rest, renormalise
    repetition penalty theta (before all of these), for each token i already in the context:
        z_i <- z_i / theta if z_i > 0 else z_i * theta     (theta > 1 makes repeats less likely)

The order is transformers' (temperature, top-k, top-p, min-p), the one a model's own
generation_config.json was written for. llama.cpp applies the same three filters in the same
order but the temperature last: at tau = 1 the two agree; at tau < 1 the filters here see a
sharper distribution and cut a little more (min-p keeps z_i >= z_max + tau ln m, where llama.cpp
keeps z_i >= z_max + ln m), which a small model's answers only gain from (docs/inference.md).

The logits are shifted by their maximum before they are divided by tau, so no tau > 0 overflows:
as tau -> 0, softmax(z / tau) tends to all its mass on the argmax (shared by exact ties), and
any tau small enough that exp((z_i - max z) / tau) underflows to 0 for every other token (below
about gap / 745, gap the distance to the runner-up; 5e-324 or 1e-308 for any logits) gives
exactly that limit: greedy decoding. Divided unshifted, z / tau overflowed to inf - inf = NaN
(`--temperature 5e-324` printed BOS after BOS, the server answered null logprobs).

Works on one row (V,) or a batch (B, V) of logits, in float64 so both engines draw the same
token from the same logits and the same seeded `numpy.random.Generator`.

Settings outside these ranges (tau < 0, k < 0, p outside (0, 1], m outside [0, 1], theta <= 0,
NaN) raise ValueError: through the Python API they are a programming error (top_p = 0 would
otherwise keep no token, give NaN probabilities and silently draw token 0); the command line
refuses them earlier with one line (`Config.validate`).

A seed below 0 (the default, sample.seed = -1) asks for a fresh one: `fresh_seed` draws it from
the operating system, and the commands print it so the same text can be drawn again with --seed.
"""

from __future__ import annotations

import functools
import math
import secrets
from collections.abc import Callable, Generator, Sequence
from typing import Any

import numpy as np

from sheepop.errors import UserError
from sheepop.softmax import softmax


def penalize_repeats(logits: np.ndarray, seen: np.ndarray, penalty: float) -> np.ndarray:
    """The logits with the repetition penalty applied where `seen` (bool, same shape) is True.

    Dividing a positive logit and multiplying a negative one both lower the token's score, so
    the rule works whatever the sign (the CTRL paper's penalty, as most libraries apply it).
    """
    z = np.asarray(logits, dtype=np.float64)
    if not (math.isfinite(penalty) and penalty > 0):
        raise ValueError(f"repetition penalty must be a finite number > 0 (1: off), not "
                         f"{penalty!r}")
    if penalty == 1.0:
        return z
    return np.where(seen, np.where(z > 0, z / penalty, z * penalty), z)


def filtered_logits(logits: np.ndarray, seen: np.ndarray | None, penalty: float,
                    never: Sequence[int] = (), allowed: np.ndarray | None = None) -> np.ndarray:
    """The logits a token is drawn from: the `never` ids, and where `allowed` (bool, the
    logits' shape: a constraint's mask) is False, set to -inf (probability 0), then the
    repetition penalty where `seen` is True (no penalty when `seen` is None). The input is
    left as it was."""
    if never or allowed is not None:
        logits = np.array(logits, copy=True)
        logits[list(never)] = -np.inf  # (a list: logits[()] would be every element)
        if allowed is not None:
            if not allowed.any():  # (a bug: a state that has ended is not asked again)
                raise ValueError("the constraint allows no token")
            logits[~allowed] = -np.inf
    return logits if seen is None else penalize_repeats(logits, seen, penalty)


def check_settings(temperature: float, top_k: int, top_p: float, min_p: float = 0.0) -> None:
    """ValueError unless 0 <= temperature < inf, top_k >= 0 (an int), 0 < top_p <= 1 and
    0 <= min_p <= 1."""
    if not (math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"temperature must be a finite number >= 0 (0: greedy), not "
                         f"{temperature!r}")
    if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 0:
        raise ValueError(f"top_k must be an integer >= 0 (0: off), not {top_k!r}")
    if not 0 < top_p <= 1:  # also refuses NaN
        raise ValueError(f"top_p must be in (0, 1] (1: off), not {top_p!r}")
    if not 0 <= min_p <= 1:  # also refuses NaN
        raise ValueError(f"min_p must be in [0, 1] (0: off), not {min_p!r}")


def probabilities(logits: np.ndarray, temperature: float = 1.0, top_k: int = 0,
                  top_p: float = 1.0, min_p: float = 0.0) -> np.ndarray:
    """The distribution the next token is drawn from, after temperature, top-k, top-p and
    min-p."""
    check_settings(temperature, top_k, top_p, min_p)
    z = np.asarray(logits, dtype=np.float64)
    if temperature <= 0:  # greedy: all mass on the argmax (the first one on ties)
        probs = np.zeros_like(z)
        np.put_along_axis(probs, z.argmax(axis=-1)[..., None], 1.0, axis=-1)
        return probs
    # shifted first: (z - max z) <= 0 divided by any tau > 0 is at worst -inf, never inf - inf
    with np.errstate(over="ignore"):  # (-inf is the intended result of an overflow here)
        probs = softmax((z - z.max(axis=-1, keepdims=True)) / temperature)
    V = probs.shape[-1]
    if 0 < top_k < V:
        kth = np.partition(probs, V - top_k, axis=-1)[..., V - top_k, None]
        probs = np.where(probs >= kth, probs, 0.0)
        probs /= probs.sum(axis=-1, keepdims=True)
    if top_p < 1.0:
        order = np.argsort(-probs, axis=-1, kind="stable")
        sorted_p = np.take_along_axis(probs, order, axis=-1)
        before = np.cumsum(sorted_p, axis=-1) - sorted_p  # mass strictly before each token
        keep_sorted = before < top_p                       # the first token is always kept
        keep = np.zeros_like(keep_sorted)
        np.put_along_axis(keep, order, keep_sorted, axis=-1)
        probs = np.where(keep, probs, 0.0)
        probs /= probs.sum(axis=-1, keepdims=True)
    if min_p > 0.0:  # (the most likely token always stays: its p is max p >= min_p * max p)
        probs = np.where(probs >= min_p * probs.max(axis=-1, keepdims=True), probs, 0.0)
        probs /= probs.sum(axis=-1, keepdims=True)
    return probs


def fresh_seed() -> int:
    """A seed drawn from the operating system's entropy (32 bits: short enough to type back)."""
    return secrets.randbits(32)


def resolved_seed(seed: int) -> int:
    """`seed`, or a fresh one when it is below 0 (sample.seed = -1: a new seed each call)."""
    return seed if seed >= 0 else fresh_seed()


def draw(probs: np.ndarray, rng: np.random.Generator) -> np.ndarray | int:
    """Draw one token per row by inverting the CDF with one uniform number per row."""
    p = np.atleast_2d(probs)
    u = rng.random(p.shape[0])[:, None]
    cdf = np.cumsum(p, axis=-1)
    ids = np.minimum((cdf <= u * cdf[:, -1:]).sum(axis=-1), p.shape[-1] - 1)
    return int(ids[0]) if np.ndim(probs) == 1 else ids


def top_tokens(probs: np.ndarray, k: int) -> list[tuple[int, float]]:
    """The k most likely tokens of one distribution, most likely first."""
    order = np.argsort(-probs, kind="stable")[:k]
    return [(int(i), float(probs[i])) for i in order]


class NonFiniteLogits(UserError):
    """The model's logits hold NaN or infinite values (a server answers it as its own 4xx)."""


def check_finite(logits: np.ndarray) -> None:
    """Finite logits, or one UserError line: weights that are each finite can still overflow
    in the forward pass (values near float32's limit, a huge pos_scale or LoRA alpha), and the
    argmax of NaN is id 0, which would be printed forever. Every sampler goes through
    `next_token`, so this is the one place that stops it."""
    bad = logits.size - int(np.isfinite(logits).sum())
    if bad:
        raise NonFiniteLogits(f"the model's next-token logits hold {bad:,} NaN or infinite values "
                        f"(of {logits.size:,}): its weights overflow in the forward pass, so "
                        "it cannot generate")


def quiet_overflow(steps: Callable[..., Generator[Any, Any, Any]]
                   ) -> Callable[..., Generator[Any, Any, Any]]:
    """`steps` with NumPy's floating-point warnings off while it computes (not while its caller
    holds a step): an overflowing model is stopped by `check_finite` with one line, not preceded
    by "RuntimeWarning: overflow" lines."""
    @functools.wraps(steps)
    def quiet(*args: Any, **kwargs: Any) -> Generator[Any, Any, Any]:
        inner, sent = steps(*args, **kwargs), None
        while True:
            with np.errstate(all="ignore"):
                try:
                    step = inner.send(sent)
                except StopIteration as end:
                    return end.value
            sent = yield step
    return quiet

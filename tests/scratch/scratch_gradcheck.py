"""Central finite differences for the scratch engine's gradient checks (float64).

For a function out = f(*arrays), the scalar L = sum(out * R) with a fixed random R has
dL/d(out) = R, so a backward pass given dout = R must return dL/d(input) ~= (L(x + h e_i) -
L(x - h e_i)) / 2h for every element i.
"""

from __future__ import annotations

import numpy as np


def numerical_grad(loss, x: np.ndarray, h: float = 1e-6, max_entries: int | None = None,
                   rng: np.random.Generator | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Central-difference dL/dx at the flat indices checked; returns (indices, grads)."""
    flat = x.reshape(-1)
    idx = np.arange(flat.size)
    if max_entries is not None and flat.size > max_entries:
        idx = np.sort((rng or np.random.default_rng(0)).choice(flat.size, max_entries, False))
    grads = np.empty(idx.size)
    for j, i in enumerate(idx):
        old = flat[i]
        flat[i] = old + h
        plus = loss()
        flat[i] = old - h
        minus = loss()
        flat[i] = old
        grads[j] = (plus - minus) / (2 * h)
    return idx, grads


def rel_error(analytic: np.ndarray, numeric: np.ndarray) -> float:
    """||a - n|| / max(||a||, ||n||): 0 when equal, scale-free."""
    a = np.asarray(analytic, dtype=np.float64).reshape(-1)
    n = np.asarray(numeric, dtype=np.float64).reshape(-1)
    scale = max(np.linalg.norm(a), np.linalg.norm(n))
    assert scale > 0, "gradient check on an all-zero gradient proves nothing"
    return float(np.linalg.norm(a - n) / scale)


def check(forward, inputs: dict[str, np.ndarray], analytic: dict[str, np.ndarray], dout,
          tol: float = 1e-6, h: float = 1e-6, max_entries: int | None = None) -> dict[str, float]:
    """Compare analytic gradients with finite differences of L = sum(forward() * dout).

    `forward()` reads the arrays in `inputs` (perturbed in place). Returns the errors and
    asserts each is <= tol.
    """
    def loss() -> float:
        out = forward()
        return float(np.sum(out * dout)) if dout is not None else float(out)

    errors = {}
    for name, x in inputs.items():
        idx, num = numerical_grad(loss, x, h, max_entries)
        errors[name] = rel_error(np.asarray(analytic[name]).reshape(-1)[idx], num)
    bad = {k: v for k, v in errors.items() if not v <= tol}
    assert not bad, f"gradient check failed (tol {tol}): {bad}"
    return errors

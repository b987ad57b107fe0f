"""Muon: momentum, then each matrix's update replaced by its nearest orthogonal matrix.

For each matrix parameter W (m x n) with gradient G, at every step (lr from the shared schedule):

    B <- mu B + (1 - mu) G                    momentum buffer (an average of the gradients)
    M <- (1 - mu) G + mu B                    Nesterov's look-ahead (M = B without it)
    O <- NS_k(M)                              ~ U V^T, where M = U S V^T (its SVD)
    W <- W (1 - lr wd)                        decoupled weight decay
    W <- W - lr sqrt(max(1, m / n)) O         entries of RMS ~ lr / sqrt(n) for every shape

NS_k is k steps of the quintic Newton-Schulz iteration on X_0 = M / ||M||_F:

    A = X X^T,   X <- a X + (b A + c A^2) X,       (a, b, c) = (3.4445, -4.7750, 2.0315)

Why it orthogonalises: with X = U S V^T, X X^T = U S^2 U^T, so one step gives
U (a S + b S^3 + c S^5) V^T: the singular vectors stay, each singular value s becomes
p(s) = a s + b s^3 + c s^5. Dividing by the Frobenius norm puts every s in (0, 1]; p's slope at
0 is a = 3.4 (small values grow fast) and p maps [0, 1] into about [0, 1.2], so five steps take
every s into roughly [0.7, 1.2]: X ~ U V^T, the update with every direction of M at the same
size. The coefficients trade exact convergence to 1 for speed (Keller Jordan's choice; torch's
defaults). The iteration runs on the side with fewer rows (X X^T is min(m, n) square), so a
tall matrix is transposed first.

The same steps on the Gram side: each step multiplies X on the left by Q = a I + b A + c A^2, a
polynomial in A = X X^T, so after k steps X_k = Q_{k-1} ... Q_0 X_0, and A_{t+1} = Q_t A_t Q_t
(X_{t+1} X_{t+1}^T = Q_t X_t X_t^T Q_t, Q_t symmetric). Every product but the first A_0 and the
last (Q_{k-1} ... Q_0) X_0 is then m x m (m = min(m, n)): 4 m^2 n + (8k - 6) m^3 flops against
the plain iteration's k (4 m^2 n + 2 m^3), fewer whenever n > 1.5 m, whatever k. It is the same
polynomial of X_0, so the result differs from the plain one by rounding only (the tests hold
both to float64's plain iteration).

The operations follow torch.optim.Muon's order (lerps as torch rounds them). torch runs the
iteration in bfloat16; NumPy has none, so here it runs in float32 (the parameter's own width):
equal to torch's within bfloat16's precision, and to the same iteration in float64 within
float32's (tests/scratch/test_muon.py).
"""

from __future__ import annotations

import math

import numpy as np

Params = dict[str, np.ndarray]

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_STEPS = 5
NS_EPS = 1e-7


def lerp(start: np.ndarray, end: np.ndarray, weight: float) -> np.ndarray:
    """start + w (end - start), rounded as torch.lerp rounds it (from the nearer end)."""
    if abs(weight) < 0.5:
        return start + start.dtype.type(weight) * (end - start)
    return end - (end - start) * start.dtype.type(1.0 - weight)


def orthogonalize(m: np.ndarray, steps: int = NS_STEPS,
                  coefficients: tuple[float, float, float] = NS_COEFFICIENTS,
                  eps: float = NS_EPS) -> np.ndarray:
    """NS_k(M): `steps` quintic Newton-Schulz steps from M / max(||M||_F, eps), ~ U V^T."""
    if m.ndim != 2:
        raise ValueError(f"Muon orthogonalises matrices, not arrays of shape {m.shape}")
    a, b, c = (m.dtype.type(x) for x in coefficients)
    tall = m.shape[0] > m.shape[1]
    x = m.T if tall else m
    x = x / max(np.linalg.norm(x), m.dtype.type(eps))
    if steps > 0 and x.shape[1] > 1.5 * x.shape[0]:
        x = left_factor(x @ x.T, steps, a, b, c) @ x
    else:
        for _ in range(steps):
            gram = x @ x.T
            x = a * x + (b * gram + c * (gram @ gram)) @ x
    return x.T if tall else x


def left_factor(gram, steps: int, a: float, b: float, c: float):
    """Q_{k-1} ... Q_0 from A_0 = X_0 X_0^T alone: Q_t = a I + b A_t + c A_t^2 and
    A_{t+1} = Q_t A_t Q_t (the module's docstring), so that NS_k(X_0) = Q_{k-1} ... Q_0 X_0.
    Only products, sums and the diagonal: it takes a NumPy matrix, or a torch stack of them
    (the torch engine's `newton_schulz` calls it, in its own dtype)."""
    diagonal = list(range(gram.shape[-1]))
    product = None
    for t in range(steps):
        q = b * gram + c * (gram @ gram)
        q[..., diagonal, diagonal] += a  # + a I
        product = q if product is None else q @ product
        if t < steps - 1:
            gram = q @ gram @ q
    return product


def lr_scale(shape: tuple[int, ...]) -> float:
    """sqrt(max(1, m / n)) (torch's "original" adjustment). O has min(m, n) singular values near
    1, so ||O||_F^2 ~ min(m, n) and its entries' RMS is ~1/sqrt(max(m, n)): 1/sqrt(n) for a wide
    matrix, 1/sqrt(m) for a tall one, which the factor brings back to 1/sqrt(n), n the input
    width (the (out, in) layout), as for a wide one."""
    rows, cols = shape[:2]
    return math.sqrt(max(1.0, rows / cols))


class Muon:
    """Muon for the matrices in `params` (every value 2-D); the other parameters belong to AdamW
    (`sheepop.arch.params.uses_muon` decides which, for both engines)."""

    def __init__(self, params: Params, lr: float = 0.02, momentum: float = 0.95,
                 nesterov: bool = True, weight_decay: float = 0.0, ns_steps: int = NS_STEPS):
        for name, p in params.items():
            if p.ndim != 2:
                raise ValueError(f"Muon takes matrices only; {name} has shape {p.shape}")
        self.params = params
        self.lr, self.momentum, self.nesterov = lr, momentum, nesterov
        self.weight_decay, self.ns_steps = weight_decay, ns_steps
        self.momentum_buffer = {k: np.zeros_like(v) for k, v in params.items()}

    def step(self, grads: Params, lr: float | None = None) -> None:
        """One update of every matrix in place, from `grads` (same keys)."""
        lr = self.lr if lr is None else lr
        mu = self.momentum
        for name, p in self.params.items():
            g, buf = grads[name], self.momentum_buffer[name]
            buf[...] = lerp(buf, g, 1.0 - mu)
            update = lerp(g, buf, mu) if self.nesterov else buf
            ortho = orthogonalize(update, self.ns_steps)
            if self.weight_decay:
                p *= p.dtype.type(1.0 - lr * self.weight_decay)
            p -= p.dtype.type(lr * lr_scale(p.shape)) * ortho

    def state_arrays(self) -> dict[str, np.ndarray]:
        """The momentum buffers as float32, named as in the checkpoint format."""
        return {f"momentum_buffer.{k}": v.astype(np.float32)
                for k, v in self.momentum_buffer.items()}

    def load_state_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        for name in self.params:
            key = f"momentum_buffer.{name}"
            if key in arrays:  # absent in a checkpoint written before step 1
                self.momentum_buffer[name][...] = arrays[key]

"""AdamW with decoupled weight decay, and global-norm gradient clipping, as torch computes them.

For each parameter p with gradient g, at step t = 1, 2, ... (lr from the shared schedule):

    p <- p * (1 - lr * wd)                    decoupled decay; wd = 0 for biases and LayerNorm
    m <- b1 m + (1 - b1) g                    first moment
    v <- b2 v + (1 - b2) g^2                  second moment
    p <- p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)

The operations run in the same order as torch.optim.AdamW's, so the two engines agree to the
last bits in float64. Updates are in place into preallocated arrays (no allocation per step).
"""

from __future__ import annotations

import math

import numpy as np

from sheepop.arch.params import decays

Params = dict[str, np.ndarray]


def clip_grad_norm(grads: Params, max_norm: float) -> float:
    """Scale every gradient by min(1, max_norm / (||g|| + 1e-6)), ||g|| the norm of all of them
    together; return ||g|| before clipping (max_norm = inf or <= 0 only measures it)."""
    total = math.sqrt(sum(float(np.vdot(g, g)) for g in grads.values()))
    if max_norm > 0 and math.isfinite(max_norm):
        coef = max_norm / (total + 1e-6)
        if coef < 1.0:
            for g in grads.values():
                g *= g.dtype.type(coef)
    return total


class AdamW:
    def __init__(self, params: Params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.01):
        self.params = params
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        self.decay = {k: decays(v.shape) for k, v in params.items()}
        self.exp_avg = {k: np.zeros_like(v) for k, v in params.items()}
        self.exp_avg_sq = {k: np.zeros_like(v) for k, v in params.items()}
        self._denom = {k: np.empty_like(v) for k, v in params.items()}
        self.t = 0

    def step(self, grads: Params, lr: float | None = None) -> None:
        """One update of every parameter in place, from `grads` (same keys)."""
        lr = self.lr if lr is None else lr
        b1, b2 = self.betas
        self.t += 1
        step_size = lr / (1.0 - b1 ** self.t)
        bc2_sqrt = math.sqrt(1.0 - b2 ** self.t)
        for name, p in self.params.items():
            g, m, v, denom = grads[name], self.exp_avg[name], self.exp_avg_sq[name], \
                self._denom[name]
            if self.decay[name] and self.weight_decay:
                p *= p.dtype.type(1.0 - lr * self.weight_decay)
            # m <- m + (1 - b1)(g - m)   (torch's lerp, the same rounding as b1 m + (1 - b1) g)
            np.subtract(g, m, out=denom)
            denom *= p.dtype.type(1.0 - b1)
            m += denom
            v *= p.dtype.type(b2)
            np.multiply(g, g, out=denom)
            denom *= p.dtype.type(1.0 - b2)
            v += denom
            np.sqrt(v, out=denom)
            denom /= p.dtype.type(bc2_sqrt)
            denom += p.dtype.type(self.eps)
            np.divide(m, denom, out=denom)
            denom *= p.dtype.type(-step_size)
            p += denom

    def state_arrays(self) -> dict[str, np.ndarray]:
        """Moments as float32, named as in the checkpoint format (exp_avg.<name>, ...)."""
        out = {f"exp_avg.{k}": v.astype(np.float32) for k, v in self.exp_avg.items()}
        out.update({f"exp_avg_sq.{k}": v.astype(np.float32) for k, v in self.exp_avg_sq.items()})
        return out

    def load_state_arrays(self, arrays: dict[str, np.ndarray], step: int) -> None:
        for name in self.params:
            if f"exp_avg.{name}" in arrays:  # absent in a checkpoint written before step 1
                self.exp_avg[name][...] = arrays[f"exp_avg.{name}"]
                self.exp_avg_sq[name][...] = arrays[f"exp_avg_sq.{name}"]
        self.t = int(step)

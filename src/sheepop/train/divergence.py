"""A diverging run stops before it saves: the last checkpoint on disk stays a good one.

After every optimizer step the trainer asks `problem(loss, grad_norm, train_cfg)`:

    the loss is not finite (NaN or inf)              the weights have stopped meaning anything
    the gradient norm (before clipping) is not finite the update just made them NaN or inf
    the gradient norm passes train.max_grad_norm     (0: no limit) a blow-up in progress: the
                                                      loss can stay finite for a few steps while
                                                      the weights grow by orders of magnitude

The default limit, 1000, is far above the pre-clipping norms of sound runs and far below those of
a blow-up. Measured on the tiny test run (2 layers, width 16, 200 steps, clipping at 1): the
largest norm was 0.99 at lr 1e-3, 12.9 at lr 0.1 and 65 at lr 10 (all trained to the end); at
lr 100 the norms went 0.85, 209, 844, 5053, 58 thousand, ... and the loss became NaN at step 9:
with a checkpoint every step, the last one saved (step 8) held weights up to 1.3e8; the limit
stops that run at step 4 instead, keeping step 3 (weights up to 2.2e3).

With float16 and its loss scaler an infinite gradient norm is routine (the scaler skips that
step and lowers its scale), so it is not a divergence there. A save also refuses weights that are
not all finite (`finite`), which covers the paths that do not pass the check (Ctrl-C, the final
save). The run then stops with one line (exit 2) that says what happened, at which step, which
checkpoint is on disk, and the command that continues from it with a lower learning rate.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from sheepop.config import TrainConfig


def problem(loss: float, grad_norm: float, cfg: TrainConfig) -> str | None:
    """What is wrong with a step that returned (`loss`, `grad_norm`), or None when nothing."""
    if not math.isfinite(loss):
        return f"the loss became {loss}"
    if not math.isfinite(grad_norm):
        return None if cfg.dtype == "float16" else f"the gradient norm became {grad_norm}"
    if cfg.max_grad_norm and grad_norm > cfg.max_grad_norm:
        return (f"the gradient norm reached {grad_norm:.4g}, past "
                f"train.max_grad_norm={cfg.max_grad_norm:g}")
    return None


def finite(weights: dict[str, np.ndarray]) -> bool:
    """Whether every weight is a finite number."""
    return all(bool(np.isfinite(w).all()) for w in weights.values())


def stopped_message(step: int, what: str, run_dir: Path, saved_step: int | None,
                    lr: float) -> str:
    """The one line a diverged run ends with."""
    if saved_step is None:
        where = ("no checkpoint was saved, so start again with a lower train.lr (now "
                 f"{lr:g}, e.g. --set train.lr={lr / 10:g})")
    else:
        # The norm is measured on the weights a step starts from: those of the kept checkpoint
        # when it is the first step after it, so continuing needs the limit lifted too.
        lift = " --set train.max_grad_norm=0" if "max_grad_norm" in what else ""
        where = (f"the checkpoint in {run_dir} is still that of step {saved_step}: continue "
                 f"from it with a lower learning rate, e.g. `sheepop train --resume --out "
                 f"{run_dir} --set train.lr={lr / 10:g}{lift}`")
    return f"training diverged at step {step}: {what}; nothing was saved after it; {where}"

"""A diverging run stops before it saves: the last checkpoint on disk stays a good one.

A save is good only once the step after it is sound. The gradient norm is measured on the
weights a step starts from, so one huge update (train.lr=1e6 took the weights from ~1 to 2.4e5
in one step) shows nothing in its own step's loss and norm, only in the next step's. So the
checkpoint of step s is kept in memory (its files, serialized) and written only when step s+1
passes `problem`; if it does not, it is dropped and the previous checkpoint stays on disk
(sheepop.train.loop). The last save of a run (its end, Ctrl-C, a signal) has no next step: it is
written only if the loss of the weights it saves, measured on the last step's own batch, is
finite and within `probe_bound` (`probe_problem`). The way to continue that the message names
then leads somewhere: the kept checkpoint's next step passed at the old learning rate, and its
norm does not depend on the learning rate, so a lower one continues without lifting the limit.

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

from sheepop.config.schema import TrainConfig


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


def probe_bound(vocab_size: int, losses_seen: float) -> float:
    """The largest loss a saved model may show on the last step's batch: twice the larger of
    ln(vocab_size) (the loss of a uniform guess, about where a new model starts) and the
    highest training loss this process has seen. A sound step moves the loss by a fraction; a
    blown-up one (weights of 2.4e5) puts it in the thousands."""
    return 2.0 * max(math.log(max(vocab_size, 2)), losses_seen)


def probe_problem(loss: float, before: float, bound: float) -> str | None:
    """What is wrong with the weights to be saved, from their `loss` on the last step's batch
    (`before`: that step's loss before its update), or None."""
    if not math.isfinite(loss) or loss > bound:
        return (f"the update took the loss on its own batch from {before:.4g} to {loss:.4g} "
                f"(more than {bound:.4g})")
    return None


def finite(weights: dict[str, np.ndarray]) -> bool:
    """Whether every weight is a finite number."""
    return all(bool(np.isfinite(w).all()) for w in weights.values())


def stopped_message(step: int, what: str, run_dir: Path, saved_step: int | None,
                    lr: float, unproven: bool = False, again_after_resume: bool = False
                    ) -> str:
    """The one line a diverged run ends with. `unproven`: the kept checkpoint is the one this
    process resumed from and `step` is the first after it, so no sound step ever followed it
    (a checkpoint written by an earlier sheepop, which saved without waiting for the next
    step): its own weights give this at any learning rate, and lifting the limit would train
    on garbage, so the advice is a new run. `again_after_resume`: it is that checkpoint, but a
    later step diverged: a resume at a lower learning rate that diverges again means its
    weights were already past saving, which the message says too."""
    again = f"a lower train.lr (now {lr:g}, e.g. --set train.lr={lr / 10:g})"
    if saved_step is None:
        where = f"no checkpoint was saved, so start again with {again}"
    elif unproven:
        where = (f"the checkpoint in {run_dir} (step {saved_step}) holds weights that give this "
                 "at any learning rate, so it cannot be continued: start a new run (another "
                 f"--out) with {again}")
    else:
        where = (f"the checkpoint in {run_dir} is still that of step {saved_step} (its next "
                 "step was sound): continue from it with a lower learning rate, e.g. `sheepop "
                 f"train --resume --out {run_dir} --set train.lr={lr / 10:g}`")
        if again_after_resume:  # a resume already tried: the weights may be past saving
            where += (f", or, if {lr:g} was already lowered after an earlier divergence, start "
                      f"a new run (another --out) with {again}")
    return f"training diverged at step {step}: {what}; nothing was saved after it; {where}"

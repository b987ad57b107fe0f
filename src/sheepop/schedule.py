"""Learning-rate schedules shared by both engines: linear warmup, then a decay to min_lr that
ends at step `decay`, a cosine (`train.schedule = cosine`) or warmup-stable-decay (`wsd`).

    lr(s) = lr_max * (s + 1) / warmup                                   for s < warmup
  cosine:
    lr(s) = min_lr + (lr_max - min_lr) * (1 + cos(pi * r)) / 2,
            r = (s - warmup) / (decay - warmup)                           for warmup <= s <= decay
  wsd, with c = ceil(cooldown * decay) steps of linear decay at the end:
    lr(s) = lr_max                                                      for warmup <= s < decay - c
    lr(s) = min_lr + (lr_max - min_lr) * (decay - s) / c                for decay - c <= s <= decay
  both:
    lr(s) = min_lr                                                        for s > decay

Step `s` counts optimizer steps from 0. Warmup uses (s + 1) so the very first step already moves
the weights (lr(0) = lr_max / warmup, not 0).
"""

from __future__ import annotations

import math


def lr_at(step: int, lr_max: float, min_lr: float, warmup: int, decay: int) -> float:
    """The learning rate for optimizer step `step` (0-based)."""
    if step < warmup:
        return lr_max * (step + 1) / warmup
    if step >= decay:
        return min_lr
    ratio = (step - warmup) / max(1, decay - warmup)
    return min_lr + (lr_max - min_lr) * 0.5 * (1.0 + math.cos(math.pi * ratio))


def wsd_lr_at(step: int, lr_max: float, min_lr: float, warmup: int, decay: int,
              cooldown: float) -> float:
    """Warmup-stable-decay: the warmup, lr_max held, then a straight line to min_lr over the
    last `cooldown` fraction of the `decay` steps. A run can be stopped (or continued) anywhere
    in the flat part and given its cool-down then, which a cosine fixes in advance."""
    if step < warmup:
        return lr_max * (step + 1) / warmup
    if step >= decay:
        return min_lr
    steps = max(1, math.ceil(cooldown * decay))
    if step < decay - steps:
        return lr_max
    return min_lr + (lr_max - min_lr) * (decay - step) / steps


def lr_for(step: int, train_cfg) -> float:
    """The schedule `train.schedule` with the values of a `TrainConfig` (decay_steps 0 means
    train.steps)."""
    decay = train_cfg.decay_steps or train_cfg.steps
    if train_cfg.schedule == "wsd":
        return wsd_lr_at(step, train_cfg.lr, train_cfg.min_lr, train_cfg.warmup_steps, decay,
                         train_cfg.cooldown)
    return lr_at(step, train_cfg.lr, train_cfg.min_lr, train_cfg.warmup_steps, decay)

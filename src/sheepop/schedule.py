"""Learning-rate schedule shared by both engines: linear warmup, then cosine decay to min_lr.

    lr(s) = lr_max * (s + 1) / warmup                                   for s < warmup
    lr(s) = min_lr + (lr_max - min_lr) * (1 + cos(pi * r)) / 2,
            r = (s - warmup) / (decay - warmup)                           for warmup <= s <= decay
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


def lr_for(step: int, train_cfg) -> float:
    """`lr_at` with the values of a `TrainConfig` (decay_steps 0 means train.steps)."""
    decay = train_cfg.decay_steps or train_cfg.steps
    return lr_at(step, train_cfg.lr, train_cfg.min_lr, train_cfg.warmup_steps, decay)

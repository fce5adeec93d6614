"""Learning rate: linear warmup, then cosine / linear decay to lr * min_lr_ratio, or constant.
A pure function of the step, so resuming needs no scheduler state."""
from __future__ import annotations

import math


def lr_at(step: int, total_steps: int, *, lr: float, warmup_steps: int, schedule: str,
          min_lr_ratio: float) -> float:
    """LR for optimizer step `step` (0-based) of a stage with `total_steps` steps."""
    if warmup_steps > 0 and step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if schedule == "constant":
        return lr
    decay_steps = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    floor = lr * min_lr_ratio
    if schedule == "linear":
        return floor + (lr - floor) * (1 - progress)
    return floor + (lr - floor) * 0.5 * (1 + math.cos(math.pi * progress))

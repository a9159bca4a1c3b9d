"""The learning-rate schedule shared by the GSPO trainer and the quickstart's SFT phase:
linear warm-up, then cosine decay to `floor` x peak at `total_steps` (held there after)."""

from __future__ import annotations

import math


def warmup_cosine_lr(peak: float, step: int, warmup_steps: int, total_steps: int, floor: float = 0.0) -> float:
    """Learning rate at optimizer step `step` (0-based). With `peak` = 1.0 it is the factor
    a `LambdaLR` wants."""
    if step < warmup_steps:
        return peak * (step + 1) / warmup_steps
    progress = min((step - warmup_steps) / max(total_steps - warmup_steps, 1), 1.0)
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))

"""The learning-rate schedule of the examples: linear warm-up, then cosine decay."""

from __future__ import annotations

import math
from collections.abc import Callable


def warmup_cosine(warmup: int, total: int) -> Callable[[int], float]:
    """The learning rate's factor after ``step`` optimizer steps (for ``LambdaLR``): linear
    warm-up, then cosine decay to a tenth of the peak at ``total``."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))

    return factor

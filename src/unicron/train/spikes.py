"""A spike in the gradient norm (issue 55): a step's gradient sum whose norm is far above the
norms of the steps before it, found before the optimizer applies it.

A device that computes a wrong but finite value (a flipped exponent bit scales a number by a
power of two) or a sample that sends training off course shows as a gradient norm many times
the recent ones. The norm of the step's sum costs one pass over the reduced buffers, the pass
the finiteness test already makes (``numerics.norm``), and every rank computes it from the same
sum, so every rank takes the same branch without another collective.

The statistic is the median of the last ``window`` norms applied: robust (a spike let through,
or a run of large norms early in training, moves it little, where a mean or a maximum would
follow it) and cheap (a hundred floats). A sum is a spike when its norm is over ``factor`` times
that median. The defaults: a window of 100 steps follows a norm that drifts as training goes
(warm-up, decay) while one odd step cannot move its median; a factor of 10 is Megatron-LM's for
its spiky-loss check (``SPIKY_LOSS_FACTOR = 10``, there against the largest loss seen), far
outside a healthy step's variation (``run.spike_factor`` and ``run.spike_window`` change them).
Nothing is judged before ``MIN_JUDGED`` norms are known.

The window is kept per generation: every member of a generation has applied the same sums
since it formed, so their limits are equal; a rank that joins (and every survivor, as the
group re-forms) starts a new window. A recovery thus leaves ``MIN_JUDGED`` steps unjudged for
spikes (never for NaN and Inf, which need no history).
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

from unicron.core.workerenv import SPIKE_FACTOR, SPIKE_WINDOW

MIN_JUDGED = 10  # norms known before a spike is judged (run.spike_window's least)


@dataclass
class SpikeWatch:
    """The recent gradient norms of one generation, and the limit a sum's norm must stay under."""

    window: int = SPIKE_WINDOW
    factor: float = SPIKE_FACTOR  # 0: spikes are not judged
    generation: int = -1
    norms: deque[float] = field(default_factory=deque)

    def limit(self, generation: int) -> float | None:
        """The norm over which a sum of ``generation`` is a spike; None: not judged (too few
        norms known in it, or spikes not judged at all)."""
        if self.factor == 0 or generation != self.generation or len(self.norms) < MIN_JUDGED:
            return None
        median = statistics.median(self.norms)
        return self.factor * median if median > 0 else None

    def applied(self, generation: int, norm: float) -> None:
        """A sum of ``generation`` with this ``norm`` is applied (finite, and no spike)."""
        if generation != self.generation:
            self.generation, self.norms = generation, deque(maxlen=self.window)
        self.norms.append(norm)

    def why(self, norm: float, limit: float) -> str:
        """What a spike's report says of it."""
        return (
            f"gradient norm {norm:.4g}, over {limit:.4g} ({self.factor:g} x the median of the "
            f"last {len(self.norms)} steps)"
        )

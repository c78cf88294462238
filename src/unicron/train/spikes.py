"""A spike in the gradient norm (issue 55): a step's gradient sum whose norm is far above the
norms of the steps before it, found before the optimizer applies it.

A device that computes a wrong but finite value (a flipped exponent bit scales a number by a
power of two) or a sample that sends training off course shows as a gradient norm many times
the recent ones. The norm of the step's sum costs one pass over the reduced buffers, the pass
the finiteness test already makes (``numerics.norm``), and every rank computes it from the same
sum.

The statistic is the median of the last ``window`` norms applied: robust (a spike let through,
or a run of large norms early in training, moves it little, where a mean or a maximum would
follow it) and cheap (the window is kept sorted as it slides). A sum is a spike when its norm
is over ``factor`` times that median. The defaults: a window of 100 steps follows a norm that
drifts as training goes (warm-up, decay) while one odd step cannot move its median; a factor of
10 is Megatron-LM's for its spiky-loss check (``SPIKY_LOSS_FACTOR = 10``, there against the
largest loss seen), far outside a healthy step's variation (``run.spike_factor`` and
``run.spike_window`` change them). Nothing is judged before ``MIN_JUDGED`` norms are known.

The same statistic judges a checked metric's value (the loss): ``sumtest.py``, which also says
how every rank comes to judge by the same limit and how a relaunch resumes the window.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field

from unicron.core.workerenv import SPIKE_FACTOR, SPIKE_WINDOW

MIN_JUDGED = 10  # norms known before a spike is judged (run.spike_window's least)


@dataclass
class SpikeWatch:
    """This rank's recent gradient norms, and the limit a sum's norm must stay under."""

    window: int = SPIKE_WINDOW
    factor: float = SPIKE_FACTOR  # 0: spikes are not judged
    norms: deque[float] = field(default_factory=deque)  # in the order applied
    ordered: list[float] = field(default_factory=list)  # the same, sorted

    def limit(self) -> float | None:
        """The norm over which a sum is a spike by this rank's window; None: not judged (too few
        norms known, or spikes not judged at all)."""
        n = len(self.ordered)
        if self.factor == 0 or n < MIN_JUDGED:
            return None
        median = (self.ordered[(n - 1) // 2] + self.ordered[n // 2]) / 2
        return self.factor * median if median > 0 else None

    def resumed(self, norms: list[float]) -> None:
        """Start from a checkpoint's window (oldest first): the last ``window`` of them."""
        self.norms.clear()
        self.ordered.clear()
        for norm in norms[-self.window :] if self.window else []:
            self.applied(float(norm))

    def applied(self, norm: float) -> None:
        """A sum with this ``norm`` is applied (finite, and no spike)."""
        if len(self.norms) == self.window:
            self.ordered.pop(bisect.bisect_left(self.ordered, self.norms.popleft()))
        self.norms.append(norm)
        bisect.insort(self.ordered, norm)

    def why(self, value: float, limit: float, what: str) -> str:
        """What a spike's report says of it (``what``: the gradient norm, a metric's name)."""
        return f"{what} {value:.4g}, over {limit:.4g} ({self.factor:g} x the median of its recent values)"

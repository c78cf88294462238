"""The tests of a step's sum before it is written back (issue 55): the gradients' and the
checked metrics' (``session.metric(name, checked=True)``, the loss most often).

A step's sum is wrong when the norm of its gradients, or the value of a checked metric (its mean
over the step's global batch, ``metric.py``), is not finite or is a spike: over ``factor`` times
the median of its recent values (``spikes.py``). A loss is checked as well as the gradients
because each shows what the other may not: a loss computed in a part of the program the backward
never reaches (a term detached, a masked position) can be NaN with finite gradients, and a loss
saturated far off course can jump while its gradients stay small. A metric's value is judged
only where a larger value is worse, as a loss is: its limit is over the median only while that
median is positive (``SpikeWatch.limit``).

Every rank judges by the same limits: each offers its own in the all-reduce that carries the
step's metrics, two numbers per thing judged (a limit and 1, or 0 and 0 where it knows too few
values), and the limit is the mean of those offered. The rung that follows a wrong sum
(``numericstep.py``) asks each rank whether its own share is wrong (``own_wrong``): its
gradients' norm as its share, or its metric's sum over the step's samples, not finite or alone
over the limit; that rank is the one named.

A checkpoint holds the windows of the step it saves (``SPIKE_WINDOWS``: the gradients' under
``GRADIENT``, a checked metric's under its name), and a worker that resumes from it starts
with them, so a relaunch judges spikes from its first step as the run before it did.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from unicron.train.metric import Metric
from unicron.train.numerics import WrongSum
from unicron.train.spikes import SpikeWatch

SPIKE_WINDOWS = "spike_windows"  # a checkpoint's windows, by what they judge (``Saving``, ``Session``)
GRADIENT = "gradient norm"  # the gradients' window (a metric's name is an identifier: never this)


class SumTest:
    """What a step loop tests its sums by: a window per thing judged, and the limits agreed."""

    def __init__(
        self, window: int, factor: float, metrics: Sequence[Metric], resumed: Mapping[str, list[float]]
    ) -> None:
        self.metrics = list(metrics)  # every declared metric: their sums lead the offered tensor
        self.checked = [i for i, m in enumerate(self.metrics) if m.checked]
        self.watches = {GRADIENT: SpikeWatch(window, factor)}
        self.watches |= {self.metrics[i].name: SpikeWatch(window, factor) for i in self.checked}
        for name, watch in self.watches.items():
            watch.resumed(list(resumed.get(name, [])))  # (a checkpoint's: judged from the first step)
        self.limits: dict[str, float | None] = dict.fromkeys(self.watches)  # the last sum's

    @property
    def checked_metrics(self) -> list[Metric]:
        return [self.metrics[i] for i in self.checked]

    @property
    def judges_spikes(self) -> bool:
        return self.watches[GRADIENT].factor != 0

    def offer(self) -> list[float]:
        """This rank's limits, to be summed over the ranks: a limit and 1 per thing judged, or
        0 and 0 where this rank knows too few values (a newcomer judges as its peers do)."""
        if not self.judges_spikes:
            return []
        offered: list[float] = []
        for watch in self.watches.values():
            limit = watch.limit()
            offered += [0.0, 0.0] if limit is None else [limit, 1.0]
        return offered

    @property
    def offered(self) -> int:
        """How many numbers ``offer`` appends."""
        return 2 * len(self.watches) if self.judges_spikes else 0

    def agree(self, summed: list[float]) -> None:
        """The limits every rank judges this sum by: the means of those offered (``summed``:
        what ``offer`` appended, summed over the ranks)."""
        self.limits = dict.fromkeys(self.watches)
        for i, name in enumerate(self.watches if summed else ()):
            total, count = summed[2 * i : 2 * i + 2]
            self.limits[name] = total / count if count > 0 else None

    def values(self, sums: Sequence[float], samples: int) -> dict[str, float]:
        """The checked metrics' values of the step: their sums over the ranks (the metrics' part
        of the offered tensor, summed), over the step's samples."""
        return {self.metrics[i].name: sums[i] / samples for i in self.checked}

    def judge(self, norm: float, values: Mapping[str, float], spikes: bool) -> None:
        """Raise ``WrongSum`` where the gradients' ``norm`` or a checked metric's value is not
        finite, or (``spikes``) a spike; else each joins its window."""
        judged = {GRADIENT: norm, **values}
        for name, value in judged.items():
            what = "the gradient sum" if name == GRADIENT else f"the step's {name}"
            if not math.isfinite(value):
                raise WrongSum(f"{what} is not finite")
            limit = self.limits[name]
            if spikes and limit is not None and value > limit:
                raise WrongSum(f"a spike in {what}: {self.watches[name].why(value, limit, name)}", True)
        for name, value in judged.items():
            self.watches[name].applied(value)

    def own_wrong(self, own_norm: float, samples: int) -> bool:
        """Whether this rank's own share of the sum is wrong: its gradients' norm (as its share)
        or a checked metric's own sum over the step's ``samples``, not finite or alone over the
        limit the last sum was judged by."""
        shares = {GRADIENT: own_norm}
        shares |= {self.metrics[i].name: self.metrics[i].own_total() / samples for i in self.checked}
        for name, share in shares.items():
            limit = self.limits[name]
            if not math.isfinite(share) or (limit is not None and share > limit):
                return True
        return False

    def windows(self) -> dict[str, list[float]]:
        """The values each spike is judged by now, oldest first: what a checkpoint holds."""
        return {name: list(watch.norms) for name, watch in self.watches.items() if watch.norms}

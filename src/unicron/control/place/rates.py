"""Achieved throughput of live tasks, measured from their workers' iteration reports.

Each worker reports the samples it processed in a step; rank 0 also says when the step ended.
A step counts once every rank of the generation reported it; the rate over the last
``window_s`` seconds of consecutive counted steps (after ``skip`` steps of a new generation,
which pay for joining and warming up) is samples per second, times the model's FLOPs per
sample: achieved FLOP/s at that world size. These replace the planner's estimate (a
:class:`~unicron.planning.throughput.MeasuredCurve`) once they differ from what the planner
uses by more than ``change``, so that noise does not make the plan flap. A task whose FLOPs per
sample are unknown (no ``model:``, no ``run.flops_per_sample``) is measured in samples per
second: they give its scaling, not its work (``planning.throughput.on_level``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from unicron.core.kept import MeasuredRates


@dataclass
class _Series:
    world: int
    seen: int = 0  # steps of this generation counted so far
    partial: dict[int, list[float]] = field(default_factory=dict)  # step -> [ranks, samples, end]
    done: deque[tuple[int, float, float]] = field(default_factory=deque)  # (step, end, samples)


# A new generation's first steps pay for joining and warming up: not measured.
WARMUP_STEPS = 5
# A measurement spans at least this many steps (and the window's seconds).
MIN_STEPS = 5


class RateMeter:
    def __init__(
        self,
        window_s: float = 15.0,
        skip: int = WARMUP_STEPS,
        min_steps: int = MIN_STEPS,
        change: float = 0.2,
    ) -> None:
        self.window_s, self.skip, self.min_steps, self.change = window_s, skip, min_steps, change
        self._series: dict[tuple[str, int], _Series] = {}
        self.used: dict[str, dict[int, float]] = {}  # task -> world -> FLOP/s the planner uses
        # task -> world -> samples/s the planner uses, for tasks whose FLOPs per sample are unknown
        self.samples: dict[str, dict[int, float]] = {}
        self.version = 0  # bumped whenever ``used`` changes

    def report(
        self,
        task: str,
        generation: int,
        world: int,
        step: int,
        rank: int,
        samples: int,
        end: float,
        flops_per_sample: float | None,
    ) -> float | None:
        """Count one rank's report; returns a new measurement when it replaces the one in use for
        this task and world size: FLOP/s, or samples/s where ``flops_per_sample`` is None."""
        key = (task, generation)
        series = self._series.get(key)
        if series is None:
            # A new generation: the old one's series is over.
            self._series = {k: v for k, v in self._series.items() if k[0] != task}
            series = self._series[key] = _Series(world)
        entry = series.partial.setdefault(step, [0.0, 0.0, 0.0])
        entry[0] += 1
        entry[1] += samples
        if rank == 0:
            entry[2] = end
        if entry[0] < series.world or not entry[2]:
            return None
        del series.partial[step]
        for old in [s for s in series.partial if s < step - 1000]:
            del series.partial[old]  # a step some rank never reported (it failed)
        series.seen += 1
        if series.seen <= self.skip:
            return None
        if series.done and series.done[-1][0] != step - 1:
            series.done.clear()  # not consecutive: start over
        series.done.append((step, entry[2], entry[1]))
        while len(series.done) > 2 and series.done[-1][1] - series.done[1][1] >= self.window_s:
            series.done.popleft()
        span = series.done[-1][1] - series.done[0][1]
        if len(series.done) <= self.min_steps or span < self.window_s:
            return None  # not a full window yet
        samples_done = sum(s for _, _, s in list(series.done)[1:])
        rate = samples_done / span * (flops_per_sample or 1.0)
        used = (self.used if flops_per_sample else self.samples).setdefault(task, {})
        previous = used.get(world)
        if previous is not None and abs(rate - previous) <= self.change * previous:
            return None
        used[world] = rate
        self.version += 1
        return rate

    def measured(self, task: str) -> dict[int, float]:
        """World size -> FLOP/s in use for the task."""
        return dict(self.used.get(task, {}))

    def measured_samples(self, task: str) -> dict[int, float]:
        """World size -> samples/s in use for a task whose FLOPs per sample are unknown."""
        return dict(self.samples.get(task, {}))

    def renamed(self, task: str, to: str) -> None:
        """The task's name passed to a new task (submitted again once it ended; the ended one
        is kept as ``to``): its measurements stay with it, not with the newcomer."""
        for rates in (self.used, self.samples):
            if task in rates:
                rates[to] = rates.pop(task)
                self.version += 1

    def kept(self) -> MeasuredRates:
        """The rates in use (kept across a coordinator's restart)."""
        return MeasuredRates(
            used={task: dict(per) for task, per in self.used.items()},
            samples={task: dict(per) for task, per in self.samples.items()},
        )

    def restore(self, kept: MeasuredRates) -> None:
        """Use the rates a coordinator before this one measured (from :meth:`kept`)."""
        self.used = {task: dict(per) for task, per in kept.used.items()}
        self.samples = {task: dict(per) for task, per in kept.samples.items()}
        self.version += 1

"""The cluster's weighted achieved FLOP/s (WAF) over time, per task and in all.

Sampled from what the coordinator counts as steps complete (each task's weighted FLOP so far,
``TaskRecord.flop``): the WAF at a sample is the weighted work counted over the last
``window_s``, divided by it. Counting follows the reports as agents relay them (every
heartbeat), so a window of several seconds smooths their arrival. Kept in memory for the last
``keep_s`` (the dashboard's charts and the Prometheus gauges; nothing decides on it).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class WafPoint:
    time: float
    tasks: Mapping[str, float]  # task -> weighted FLOP/s over the window ending here

    @property
    def cluster(self) -> float:
        return sum(self.tasks.values())


@dataclass
class WafHistory:
    period_s: float = 2.0
    window_s: float = 10.0
    keep_s: float = 1800.0
    counted: deque[tuple[float, dict[str, float]]] = field(default_factory=deque)  # (time, task -> FLOP)
    points: deque[WafPoint] = field(default_factory=deque)

    def sample(self, now: float, counted: Mapping[str, float]) -> WafPoint | None:
        """Note each task's weighted FLOP counted so far, at most every ``period_s``; the new
        point, if one was taken."""
        if self.counted and now - self.counted[-1][0] < self.period_s:
            return None
        self.counted.append((now, dict(counted)))
        while self.counted and now - self.counted[0][0] > self.window_s + self.period_s:
            self.counted.popleft()
        then, before = self._start_of_window(now)
        span = now - then
        rates = {
            t: max(0.0, (flop - before.get(t, flop)) / span) if span > 0 else 0.0
            for t, flop in counted.items()
        }
        point = WafPoint(now, rates)
        self.points.append(point)
        while self.points and now - self.points[0].time > self.keep_s:
            self.points.popleft()
        return point

    def _start_of_window(self, now: float) -> tuple[float, dict[str, float]]:
        """The oldest sample within the window (the first one if none is older)."""
        times = [t for t, _ in self.counted]
        i = min(bisect_left(times, now - self.window_s), len(times) - 1)
        return self.counted[i]

    def latest(self) -> WafPoint | None:
        return self.points[-1] if self.points else None

    def since(self, start: float) -> list[WafPoint]:
        return [p for p in self.points if p.time > start]

"""When the coordinator's Python garbage collector runs: rarely over the objects that live long.

At a few thousand agents the coordinator holds about 40 objects for each open connection (uvicorn's
protocol, parser, transport, flow control, ...) and each agent keeps two (heartbeats and the long
poll). CPython's full collection scans every tracked object: measured on this machine with 2,048
agents, 170,000 objects and 130-270 ms with the loop stopped, every 5-10 s (the long polls'
objects, alive two seconds each, keep promoting survivors into the oldest generation). Those
pauses were the heartbeat latency's 99th percentile.

So, as large Python services do (``gc.freeze``, Python 3.7+): once serving, and then every
``freeze_every_s``, the objects alive are moved out of the collector's sight; collections then
scan only what was made since. Every second: with the heartbeat cadence of a large cluster
(``core/cadence.py``) the long polls live several seconds, and frozen every 5 s the objects made
since filled the oldest generation again and its collections were the p99 once more (2,048
agents: 0.16 s; frozen every second, 0.05 s). A frozen object that is released is still freed at once by
reference counting; only a reference cycle among frozen objects waits, for the full collection
run every ``full_every_s`` (unfreeze, collect everything, freeze again: one pause an hour).
"""

from __future__ import annotations

import enum
import gc
from dataclasses import dataclass


class GcStep(enum.Enum):
    NOTHING = "nothing"
    FREEZE = "freeze"  # hide the objects alive now from the collector
    FULL = "full"  # unfreeze, collect every generation, freeze again


@dataclass
class GcPolicy:
    freeze_every_s: float = 1.0  # gc.freeze is cheap (it moves a list); see above
    full_every_s: float = 3600.0
    frozen_at: float | None = None
    full_at: float | None = None

    def due(self, now: float) -> GcStep:
        """What to do at ``now`` (monotonic seconds); pure."""
        if self.full_at is None or self.frozen_at is None:
            return GcStep.FULL  # the first: what start-up made (imports, the loaded state)
        if now - self.full_at >= self.full_every_s:
            return GcStep.FULL
        return GcStep.FREEZE if now - self.frozen_at >= self.freeze_every_s else GcStep.NOTHING

    def step(self, now: float) -> GcStep:
        """Do what is due."""
        what = self.due(now)
        if what is GcStep.FULL:
            gc.unfreeze()
            gc.collect()
            self.full_at = now
        if what is not GcStep.NOTHING:
            gc.freeze()
            self.frozen_at = now
        return what

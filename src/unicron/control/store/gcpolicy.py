"""When the coordinator's Python garbage collector runs: rarely over the objects that live long.

At a few thousand agents the coordinator holds about 40 objects for each open connection (uvicorn's
protocol, parser, transport, flow control, ...) and each agent keeps two (heartbeats and the long
poll). CPython's full collection scans every tracked object: measured on this machine with 2,048
agents, 170,000 objects and 130-270 ms with the loop stopped, every 5-10 s (the long polls'
objects, alive two seconds each, keep promoting survivors into the oldest generation). Those
pauses were the heartbeat latency's 99th percentile.

So, as large Python services do (``gc.freeze``, Python 3.7+): once serving, and then every
``freeze_every_s``, the objects alive are moved out of the collector's sight; collections then
scan only what was made since. Every tick (0.1 s): frozen every 5 s, the objects made since
filled the oldest generation again and its collections were the p99 once more (2,048 agents:
0.16 s; frozen every second, 0.05 s); and in the decide bench's burst (``bench/decide_bench.py``:
100 failures in a second, each re-forming a generation of 160 workers, hundreds of rows),
frozen every second, a collection of the oldest generation still took 40-80 ms of a crash's
decision, the second-slowest of the hundred; frozen every tick, none did. A frozen object
that is released is still freed at once by reference counting; only a reference cycle among
frozen objects waits, for the next full collection (unfreeze, collect everything, freeze again):
every ``full_every_s``, or sooner once the process's resident memory has grown ``full_growth``
times over since the last (a cycle made and dropped every tick cannot pile up for an hour).
Memory, not the frozen objects: counting them walks them all (``gc.get_freeze_count``: 95 ms at
500,000 in the decide bench, every tick); the resident size is one small read of
``/proc/self/statm``. (Not the peak, ``ru_maxrss``: it never goes down, so after each full
collection the next would wait for twice the memory the garbage had reached.) The decide bench's
burst made no cyclic garbage at all (the collector found none); a service's connections make
some (uvicorn's protocols, asyncio's futures), which this bounds. A legitimate growth (a cluster
registering) is collected in full once per doubling.
"""

from __future__ import annotations

import enum
import gc
import resource
from dataclasses import dataclass
from pathlib import Path


class GcStep(enum.Enum):
    NOTHING = "nothing"
    FREEZE = "freeze"  # hide the objects alive now from the collector
    FULL = "full"  # unfreeze, collect every generation, freeze again


STATM = Path("/proc/self/statm")  # (Linux: sizes in pages; the second, resident)
PAGE = resource.getpagesize()


def resident_memory() -> int:
    """The process's resident memory now, in bytes."""
    return int(STATM.read_text().split()[1]) * PAGE


@dataclass
class GcPolicy:
    freeze_every_s: float = 0.1  # gc.freeze is cheap (it moves a list); see above
    full_every_s: float = 3600.0
    full_growth: float = 2.0  # resident memory this many times that after the last full: one now
    frozen_at: float | None = None
    full_at: float | None = None
    memory_after_full: int = 0  # the resident memory after the last full collection (bytes)

    def due(self, now: float, memory: int = 0) -> GcStep:
        """What to do at ``now`` (monotonic seconds) with ``memory`` resident; pure."""
        if self.full_at is None or self.frozen_at is None:
            return GcStep.FULL  # the first: what start-up made (imports, the loaded state)
        if now - self.full_at >= self.full_every_s or memory > self.full_growth * self.memory_after_full:
            return GcStep.FULL
        return GcStep.FREEZE if now - self.frozen_at >= self.freeze_every_s else GcStep.NOTHING

    def step(self, now: float) -> GcStep:
        """Do what is due."""
        what = self.due(now, resident_memory())
        if what is GcStep.FULL:
            gc.unfreeze()
            gc.collect()
            self.full_at = now
            self.memory_after_full = resident_memory()
        if what is not GcStep.NOTHING:
            gc.freeze()
            self.frozen_at = now
        return what

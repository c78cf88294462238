"""How often the agents beat, for the size of the cluster, and how long a node may be silent.

Every heartbeat costs the coordinator the same (an HTTP request read, checked and answered on its
one event loop: most of its CPU at scale is the HTTP server's own, not the decisions), so with a
fixed interval its load grows with the cluster. Measured here (``bench/scale_bench.py``, 2 cores
shared with the simulated agents): 2,048 agents every 0.5 s saturated the loop (about 2,300 beats
answered a second at 0.9 of a core, p99 0.25 s, thousands of beats failed, dozens of healthy
nodes silent past their deadline); 1,024 agents every 0.625 s (about 1,600 beats and 400 long
polls a second) took 0.73 of a core with a p99 of 0.12-0.18 s. So the beats the coordinator asks
for are capped at ``heartbeat_rate_max`` a second (1,000: about half a core here): past
``heartbeat_rate_max x heartbeat_interval_s`` nodes the interval grows with the node count, and
the deadline with it (the same number of beats missed makes a loss; an agent's long poll waits
four intervals, so it thins out alike). Other systems do the same at scale with far
longer periods (Kubernetes' node leases: 10 s renewal, 40 s grace; Ray's health checks: 3 s,
five missed). Only a silent node's detection slows: a worker's exit, an exception, a hang are
reported at once, in a heartbeat sent at once, whatever the interval.

The interval stops growing where its deadline would reach ``WIDEST_SHARE`` of the shortest setting
that a node loss must come before (a recovery's deadline, a held mass silence, a hang, ...: the
ordering in ``core/settings.py``, which must hold for the deadline in effect too); past that size
the coordinator is asked for more than its budget (with the defaults, past 3,000 nodes: 3 s and
15 s).

Agents learn the interval from every answer (registration and heartbeat). When it shrinks (nodes
left), an agent may still wait out the longer one before it hears of the change, so nodes are
judged by the longer deadline for as long as that: :class:`Pace`.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from unicron.core.settings import Settings

STEPS_PER_INTERVAL = 4  # the interval grows in quarters of the configured one (not at every join)
WIDEST_SHARE = 0.75  # of the shortest setting a loss must come before: the longest deadline
# Settings a node's loss must be decided before (``core/settings.py``'s ordering).
BEFORE_LOSS = (
    "hang_cap_s",
    "membership_timeout_s",
    "recovery_deadline_s",
    "first_step_timeout_s",
    "start_timeout_s",
    "forget_lost_node_s",
    "mass_silence_hold_s",
)


JITTER = 0.1  # each wait between an agent's heartbeats is the interval +- this share, at random


def jittered(interval_s: float) -> float:
    """The wait before an agent's next heartbeat. Agents started together (a job's start, a
    registration storm, a coordinator's takeover) would beat together for good: at 2,048 agents
    their beats came in waves of 500-700 within a quarter second, each wave answered in up to 0.2 s
    on a coordinator at 0.6 of a core. A random share of the interval on every wait spreads them
    out within a few beats (as Kubernetes jitters its nodes' status updates)."""
    return interval_s * random.uniform(1.0 - JITTER, 1.0 + JITTER)


@dataclass(frozen=True)
class Cadence:
    interval_s: float  # how often each agent beats
    deadline_s: float  # silence after which its node is lost


def cadence_for(nodes: int, limits: Settings) -> Cadence:
    """The cadence for ``nodes`` nodes in service: the configured one while their beats stay
    within ``heartbeat_rate_max`` a second, else an interval that keeps them there (in steps of a
    quarter of the configured interval, at most :func:`widest_scale` times it)."""
    base, step = limits.heartbeat_interval_s, limits.heartbeat_interval_s / STEPS_PER_INTERVAL
    wanted = nodes / limits.heartbeat_rate_max
    scale = 1.0 if wanted <= base else math.ceil(wanted / step) * step / base
    scale = min(scale, widest_scale(limits))
    return Cadence(base * scale, limits.heartbeat_deadline_s * scale)


def widest_scale(limits: Settings) -> float:
    """How far the interval may grow: until its deadline is ``WIDEST_SHARE`` of the shortest
    setting a node loss must be decided before (at least the configured interval)."""
    shortest: float = min(getattr(limits, name) for name in BEFORE_LOSS)
    return max(1.0, shortest * WIDEST_SHARE / limits.heartbeat_deadline_s)


@dataclass
class Pace:
    """The cadence agents are told (``told``) and the one their nodes are judged by
    (``judged``): after the interval shrinks, the previous, longer one until every agent has
    had a beat's answer since."""

    limits: Settings
    told: Cadence
    wider: Cadence | None = None  # the cadence before it shrank, judged by until ``wider_until``
    wider_until: float = 0.0

    @classmethod
    def start(cls, limits: Settings) -> Pace:
        return cls(limits, cadence_for(0, limits))

    def nodes_in_service(self, nodes: int, now: float) -> None:
        new = cadence_for(nodes, self.limits)
        if new.interval_s < self.told.interval_s:
            # An agent told the old interval may wait it out once more, then beat and learn.
            if self.wider is None or self.told.deadline_s > self.wider.deadline_s:
                self.wider = self.told
            self.wider_until = now + self.told.interval_s + self.told.deadline_s
        self.told = new

    def judged(self, now: float) -> Cadence:
        if self.wider is not None and now < self.wider_until:
            return max(self.wider, self.told, key=lambda c: c.interval_s)  # (it may have grown again)
        self.wider = None
        return self.told

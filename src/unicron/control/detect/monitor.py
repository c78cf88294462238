"""Statistical monitoring of iterations: hangs and stragglers, from the reports of each step.

A task's step times come from rank 0's reports (the step's end on the worker's clock). After a
warm-up, a step is late once clamp(k x mean of the recent intervals, floor, cap) has passed since
the previous step ended, or since a rank was last seen saving that step's checkpoint (for at most
``checkpoint_allowance_s``); the caller adds one heartbeat for the report's way to the
coordinator. A save is waited for only while it is seen: a fixed allowance for every step after
a checkpoint step would let a hang in that step go unseen for the whole allowance.

A rank whose own compute time stays above ``straggler_ratio`` x its peers' median for
``straggler_window`` consecutive steps is a straggler: the task runs sub-healthy. It stays one
until it has kept within that bound for as many consecutive steps: one step that a loaded host
slows its peers in, or that it happens to be quick in, does not make a straggler flap.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

from unicron.core.settings import Settings


@dataclass
class TaskMonitor:
    settings: Settings
    last_step: int = 0
    last_time: float = 0.0
    # When this monitor began to judge, for one with no step of its own yet (a restarted or new
    # leader's, warm with its predecessor's step times): the next step is late counted from then.
    watching_since: float = 0.0
    # The last time (coordinator's clock) a rank was seen saving the checkpoint of a step, and
    # which step: the step after it is late counted from then (``since``).
    saving_seen: tuple[int, float] = (0, 0.0)
    # Formed in place from its predecessor's members (a grow, a planned shrink, an in-process
    # recovery), with no step of its own ended yet: that step holds the members' step boundary,
    # the group's re-forming and newcomers receiving their state, so it may take as long as an
    # in-process recovery may (``recovery_deadline_s``), not k x a step.
    reforming: bool = False
    intervals: deque[float] = field(default_factory=deque)
    compute: dict[int, dict[int, float]] = field(default_factory=dict)  # step -> rank -> compute_s
    # rank -> consecutive judged steps whose slowness disagrees with the rank's status
    streak: dict[int, int] = field(default_factory=dict)
    stragglers: set[int] = field(default_factory=set)

    def step_done(self, step: int, ended: float) -> None:
        """Rank 0 finished ``step`` at worker time ``ended``."""
        reformed, self.reforming = self.reforming, False
        if step <= self.last_step or reformed:
            # Training went back (a restart from an earlier checkpoint), or this step held a
            # re-forming and is no step time: re-anchor on it.
            self.last_step, self.last_time = step, ended
            return
        if self.last_time and step == self.last_step + 1:
            self.intervals.append(ended - self.last_time)
            while len(self.intervals) > self.settings.hang_window:
                self.intervals.popleft()
        self.last_step, self.last_time = step, ended

    def mean_interval(self) -> float | None:
        if len(self.intervals) < self.settings.hang_warmup_steps:
            return None
        return statistics.fmean(self.intervals)

    def deadline(self) -> float:
        """Seconds after ``since`` by which the next step must end. Before the warm-up ends there
        is no step time to go by, so the cap, which bounds every step anyway: without it a rank
        hung in a task's first steps (after the first, which the launch's own timeout covers) was
        never found (a soak's struck worker stalled its task for 590 s)."""
        mean = self.mean_interval()
        deadline = self.settings.hang_cap_s if mean is None else self.settings.hang_deadline(mean)
        return max(deadline, self.settings.recovery_deadline_s) if self.reforming else deadline

    def saving(self, step: int, seen: float) -> None:
        """A rank was seen at ``seen`` saving the checkpoint of ``step`` (its reported position)."""
        self.saving_seen = (step, seen)

    def watch_from(self, now: float, step: int) -> None:
        """Begin to judge at ``now``, the task at ``step``: a monitor that saw no step yet counts
        the next one's lateness from here (not from time zero: the predecessor's last step is
        not known), and names the step after ``step`` as the one that is late."""
        if not self.last_time and not self.watching_since:
            self.watching_since, self.last_step = now, step

    def seen_past(self, step: int, now: float) -> None:
        """Every rank was seen at ``now`` training past ``step``, whose end was not heard
        (``hangs.trained_past``): the next step's lateness counts from then."""
        self.last_step, self.watching_since = max(self.last_step, step), now

    @property
    def since(self) -> float:
        """What the next step's lateness counts from: the last step's end, else the watch's
        start; or, while the last step's checkpoint was seen being saved after that, the last
        time it was seen (up to ``checkpoint_allowance_s`` after the step's end: a save that
        takes longer is judged as a hang)."""
        ended = max(self.last_time, self.watching_since)
        step, seen = self.saving_seen
        if step < self.last_step:
            return ended  # a save of an earlier step (or none)
        return max(ended, min(seen, ended + self.settings.checkpoint_allowance_s))

    def late(self, now: float) -> bool:
        return now - self.since > self.deadline()

    def rank_compute(self, step: int, rank: int, compute_s: float, world: int) -> list[tuple[int, bool]]:
        """Record a rank's compute time; returns (rank, is_straggler) for ranks whose status changed.
        A step is judged once, when the last of its ranks reports, and then forgotten (a report
        sent again does not count twice)."""
        per = self.compute.setdefault(step, {})
        per[rank] = compute_s
        for old in [s for s in self.compute if s < step - 2]:
            del self.compute[old]
        if len(per) < world or world < 2:
            return []
        del self.compute[step]
        changes = []
        for r, value in per.items():
            peers = statistics.median(v for k, v in per.items() if k != r)
            slow = peers > 0 and value > self.settings.straggler_ratio * peers
            straggling = r in self.stragglers
            self.streak[r] = self.streak.get(r, 0) + 1 if slow != straggling else 0
            if self.streak[r] >= self.settings.straggler_window:
                (self.stragglers.add if slow else self.stragglers.discard)(r)
                self.streak[r] = 0
                changes.append((r, slow))
        return changes

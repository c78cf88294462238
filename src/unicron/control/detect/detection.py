"""The generations' health judged on the coordinator's tick: late steps (hangs), workers that
never started, peer checks of a stall with no culprit. (Silent nodes: ``nodewatch.py``.)

Exits, exceptions and iteration reports arrive with heartbeats (``coordinator.py``); this module
judges what only time can tell. Each judgement is a pure function of records and ``now``; the
``Detector`` returns what it finds (:class:`Failing` generations, :class:`Judged` checks), and the
coordinator hands that to recovery: detection decides what failed, recovery what to do about it.
Detection reads whether a generation is being handled through :class:`Handled`, a read-only
view recovery provides, and imports nothing of recovery.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from unicron.brain.records import TaskRecord, WorkerRecord
from unicron.control.context import Context
from unicron.control.detect.hangs import HangVerdict, NotYet, Sighting, WorkerKey, hang_verdict, trained_past
from unicron.control.detect.monitor import TaskMonitor
from unicron.control.detect.peercheck import STUCK, PeerCheck, outcome, probe_endpoints
from unicron.core.cadence import cadence_for
from unicron.core.kept import StepTimes
from unicron.core.protocol import (
    AGENT_RETRY_CAP_S,
    Phase,
    Progress,
    StacksReport,
    WorkerState,
)
from unicron.core.settings import Settings
from unicron.core.states import NodeState, WorkerPhase
from unicron.core.taxonomy import ErrorKind, Scope

GenerationKey = tuple[str, int]  # (task, generation)


class Handled(Protocol):
    """What detection reads of recovery: whether a generation's failure is being handled."""

    def has_incident(self, key: GenerationKey) -> bool:
        """An incident of the generation is open."""
        ...

    def awaiting_cause(self, key: GenerationKey) -> bool:
        """Survivors of the generation reported a peer's failure; its cause is due."""
        ...


@dataclass(frozen=True)
class Failing:
    """A generation found failing by watching it, for recovery to open an incident for."""

    task: str
    generation: int
    kind: ErrorKind
    node: str | None  # the node to blame, if any
    why: str
    failed: frozenset[int] | None = None  # the ranks known gone (None: not known)
    seen_at: float | None = None  # when the symptom began
    scope: Scope | None = None
    hang: bool = False  # a hang: the stacks reported for the generation are its incident's


@dataclass(frozen=True)
class Judged:
    """A peer check complete: the failure it found (None: graced, or handled meanwhile), and
    the stacks the check gathered, recorded with the incident once it is open."""

    key: GenerationKey
    failing: Failing | None
    stacks: tuple[StacksReport, ...]


@dataclass(frozen=True)
class Grace:
    """A slow network's grace for a late step: no incident until ``until``."""

    step: int
    until: float
    renewable: bool  # TCP was seen retransmitting: the peers are checked again when it runs out
    renewals: int = 0  # graces given to the step before this one

    def again(self, late_step: int, waited_by_then_s: float, limits: Settings) -> bool:
        """Whether a late step is to be checked (and graced) again: a step not graced yet, or
        one whose stall was a lossy link's backoff, renewed fewer than
        ``network_grace_renewals`` times, while the step would have waited less than the hang
        cap by the end of another grace (so a renewed grace ends before the collective times
        out: hang_cap_s < process_group_timeout_s). Otherwise the stall is handled."""
        if late_step != self.step:
            return True
        renewals_left = self.renewals < limits.network_grace_renewals
        return self.renewable and renewals_left and waited_by_then_s < limits.hang_cap_s

    def following(self, step: int, until: float, renewable: bool) -> Grace:
        """The grace given next: a renewal when it is for the same step."""
        return Grace(step, until, renewable, self.renewals + 1 if step == self.step else 0)


def stuck(task: TaskRecord, step: int, since: float, grace: Grace, why: str) -> Failing:
    """A late step whose every rank waits in a collective, still late after its graces while
    every node reached every other: stuck, not slow (``peercheck.STUCK``). Every rank is alive
    and none is to blame (``failed`` empty, no node): the cheapest tier that may mend it is a
    reattempt in place, every rank leaving the collective and re-forming."""
    graces = grace.renewals + 1
    return Failing(
        task.name,
        task.generation,
        STUCK,
        None,
        f"step {step} late after {graces} grace(s) of a network every node reaches: a collective"
        f" stuck, not slow ({why})",
        failed=frozenset(),
        seen_at=since,
        hang=True,
    )


def settled_for(mean_s: float, deadline_s: float, interval_s: float, launching: bool = False) -> float:
    """How long a rank must have been read outside the collective its peers wait in to be blamed
    (``hangs.hang_verdict``): nearly the whole deadline, the deadline less a mean step (what of
    the step a rank may spend before it stops), at least a heartbeat. A rank hung there has been
    for that long when the step is judged (the deadline and a heartbeat after the last step
    ended), give or take its reading's way; one read there briefly, or for a slow micro-batch on a
    loaded host, had moved on when a delayed heartbeat brought the reading (a tenth of packets
    lost, CI). A heartbeat before any step time (``mean_s`` 0) and at a launch's first step,
    whose deadline counts loading the state and forming the group (no rank is there that long)."""
    if launching or mean_s <= 0:
        return interval_s
    return max(interval_s, deadline_s - mean_s)


def launch_began(workers: Sequence[WorkerRecord]) -> float:
    """When a launch's last worker was ordered: its start is timed from then."""
    return max(w.launched for w in workers)


def first_step_allowance(limits: Settings, measured_s: float | None, misses: int = 0) -> float:
    """How long a launch's first step may take once its workers' sessions all began (there are
    no step times of it yet). A task's first launch: ``first_step_timeout_s``, long, as loading and compiling
    may take minutes. A relaunch is the same program on the same data, now also loading a
    checkpoint: ``hang_multiple`` times the longest first step of its earlier launches
    (``measured_s``) plus ``checkpoint_allowance_s``, if shorter (before: ten minutes by default
    to find a rank hung in the first step after every relaunch). Never under
    ``heartbeat_deadline_s``: a node's loss is decided before a hang. Doubled for each relaunch
    in a row whose first step was found late (``misses``): a host slower now than at the first
    launch (loaded, its disk or page cache cold) would otherwise be relaunched forever, each
    launch cut off before its first step ends (seen in the soak with both cores busy, when the
    allowance still counted the start: 15 s allowed, four workers importing torch on two loaded
    cores, twenty relaunches; loading the state on a loaded host can do the same)."""
    if measured_s is None:
        return limits.first_step_timeout_s
    derived = (limits.hang_multiple * measured_s + limits.checkpoint_allowance_s) * 2.0 ** min(misses, 32)
    return min(limits.first_step_timeout_s, max(derived, limits.heartbeat_deadline_s))


@dataclass
class Detector:
    ctx: Context
    handled: Handled
    monitors: dict[tuple[str, int], TaskMonitor] = field(default_factory=dict)
    # What each worker process last reported, by (task, pid): whether it is stopped (SIGSTOP),
    # where it is and since when. By process, not by rank: a survivor renamed into a new generation
    # is reported under its old identity until its agent has carried the rename out.
    processes: dict[tuple[str, int], Sighting] = field(default_factory=dict)
    hang_incidents: dict[tuple[str, int], int] = field(default_factory=dict)  # (task, gen) -> incident
    checks: dict[tuple[str, int], PeerCheck] = field(default_factory=dict)  # hangs awaiting a peer probe
    graced: dict[tuple[str, int], Grace] = field(default_factory=dict)
    judging_from: float = 0.0  # after a stall of the coordinator, hangs are judged from then
    deferred: dict[str, tuple[int, int]] = field(default_factory=dict)  # task -> (gen, step) said deferred
    restored: dict[str, list[float]] = field(default_factory=dict)  # step times kept by a predecessor
    # task -> the longest a launch's first step took, from its workers' sessions' start to its end
    # (this coordinator's own measurements: after a restart, relaunches get the full timeout)
    first_steps: dict[str, float] = field(default_factory=dict)
    # task -> the launches (generations) in a row whose first step was found late (each doubles
    # the allowance of the next)
    first_step_late: dict[str, set[int]] = field(default_factory=dict)
    # (task, pid) -> (generation, when the worker was first seen in its training session of that
    # generation: its first position there); a launch's first step is timed from the last of its
    # workers' (``session_began``). One entry a process, as ``processes``.
    in_session: dict[tuple[str, int], tuple[int, float]] = field(default_factory=dict)

    def monitor(self, name: str, generation: int) -> TaskMonitor:
        key = (name, generation)
        if key not in self.monitors:
            previous = next((m for (t, _), m in self.monitors.items() if t == name), None)
            self.monitors = {k: v for k, v in self.monitors.items() if k[0] != name}
            monitor = TaskMonitor(self.ctx.limits)
            if previous is not None:
                # A membership change does not change how long a step takes: keep the history,
                # so that a hang right after the change is caught too (the change's own first
                # step is given as long as a re-forming: ``TaskMonitor.reforming``).
                monitor.intervals = deque(previous.intervals)
                monitor.last_step, monitor.last_time = previous.last_step, previous.last_time
                monitor.reforming = True
            elif name in self.restored:  # the coordinator before this one measured them
                monitor.intervals = deque(self.restored.pop(name))
            self.monitors[key] = monitor
        return self.monitors[key]

    def step_times(self) -> dict[str, list[float]]:
        """Each task's recent step intervals (what judges hangs), as plain data to keep."""
        return {name: list(m.intervals) for (name, _), m in self.monitors.items()} | {
            name: times
            for name, times in self.restored.items()
            if not any(k[0] == name for k in self.monitors)
        }

    def worker_seen(self, state: WorkerState, now: float, read_at: float | None) -> None:
        """What a heartbeat its agent sent at ``read_at`` (the node's clock, as the position's)
        says of a worker process: whether it is stopped, where it is and for how long (saving a
        checkpoint: the step after it is late counted from now, ``TaskMonitor.since``)."""
        where = state.progress
        held_s = (
            None if where is None or read_at is None or not where.time else max(0.0, read_at - where.time)
        )
        self.processes[(state.task, state.pid)] = Sighting(state.stopped and state.running, where, held_s)
        if where is not None:
            known = self.in_session.get((state.task, state.pid))
            if known is None or known[0] < where.generation:
                self.in_session[(state.task, state.pid)] = (where.generation, now)
        if where is not None and where.phase is Phase.CHECKPOINT:
            monitor = self.monitors.get((state.task, where.generation))
            if monitor is not None:
                monitor.saving(where.step, now)

    def observed(self, workers: Sequence[WorkerRecord]) -> dict[WorkerKey, Sighting]:
        """Whether each worker is stopped, and where it is, as its process last reported (under
        whichever identity its agent knew it by)."""
        return {w.key: self.processes.get((w.task, w.pid), Sighting()) for w in workers if w.pid is not None}

    def positions(self, workers: Sequence[WorkerRecord]) -> dict[WorkerKey, Progress | None]:
        return {key: seen.at for key, seen in self.observed(workers).items()}

    def forget(self, name: str) -> None:
        self.monitors = {k: v for k, v in self.monitors.items() if k[0] != name}
        self.processes = {k: v for k, v in self.processes.items() if k[0] != name}
        self.checks = {k: v for k, v in self.checks.items() if k[0] != name}
        self.graced = {k: v for k, v in self.graced.items() if k[0] != name}
        self.deferred.pop(name, None)
        self.restored.pop(name, None)
        self.in_session = {k: v for k, v in self.in_session.items() if k[0] != name}
        # A task submitted again under this name is a new one: its first launch gets the full
        # first-step timeout, not the allowance measured on the old one's.
        self.first_steps.pop(name, None)
        self.first_step_late.pop(name, None)

    def started(self, now: float) -> float | None:
        """The coordinator starts over a store whose tasks have workers (a restart, or a takeover
        from a leader that died): they trained on without it, and their agents, which may be
        pausing between tries (up to ``AGENT_RETRY_CAP_S``), have yet to deliver what they did.
        No step is judged late until every agent has had that long and a heartbeat deadline more
        (the deadline of the nodes in service: the first tick sets the cadence), as a node's
        silence is not (``nodewatch.silent_nodes``); each task's step is timed from the start
        meanwhile (``check_hang``). Returns when judging begins (None: no task trains, nothing to
        wait for). (A standby that took over in a loaded suite once judged a healthy task hung
        within seconds of its start, and relaunched it.)"""
        store = self.ctx.store
        if not any(t.state.active for t in store.tasks(live_only=True)):
            return None
        nodes = sum(n.state is not NodeState.LOST for n in store.nodes())
        deadline_s = max(cadence_for(nodes, self.ctx.limits).deadline_s, self.ctx.pace.judged(now).deadline_s)
        self.judging_from = max(self.judging_from, now + AGENT_RETRY_CAP_S + deadline_s)
        return self.judging_from

    def resumed(self, now: float, stalled_s: float) -> None:
        """The coordinator ran again after ``stalled_s`` without: every node gets a full
        heartbeat deadline from now (as after a restart), and steps are judged late only once
        every agent had time to deliver what its workers did meanwhile (they trained on:
        nothing about them needs the coordinator)."""
        # (Never sooner than a start's grace: the stall may come while agents still find it.)
        self.judging_from = max(self.judging_from, now + self.ctx.pace.judged(now).deadline_s)
        self.ctx.act.record("coordinator_stalled", seconds=round(stalled_s, 3), grace_until=self.judging_from)

    def check_start(self, task: TaskRecord, now: float) -> Failing | None:
        """A launch: every worker must start within ``launch_timeout_s``, and all must have started
        their training sessions (each has reported a position) within ``start_timeout_s``; from
        then the first step must end within ``first_step_timeout_s`` (the step-time statistics
        that find a hang later do not exist yet, so without this a rank hung in it stalls the
        task). The step is timed from the sessions' start, not from the launch: how long the
        processes took to start (importing torch on a loaded host) is no part of it, so a rank
        hung in it is found as soon after its peers are ready however slow the start was."""
        if now < self.judging_from:
            return None  # the coordinator just stalled: the agents' reports are still on their way
        limits, store = self.ctx.limits, self.ctx.store
        timeout = limits.launch_timeout_s
        stale = [w for w in store.launching(task.name, task.generation) if now - w.launched > timeout]
        if stale:
            why = f"{len(stale)} worker(s) never started"
            return Failing(task.name, task.generation, ErrorKind.EXITED_ABNORMALLY, None, why)
        key = (task.name, task.generation)
        handled = self.handled.has_incident(key) or self.handled.awaiting_cause(key) or key in self.checks
        if task.launched_generation != task.generation or handled:
            return None  # an in-place generation: its incident's deadline covers it
        workers = store.workers(task.name, task.generation)
        if not workers:
            return None
        if not all(w.state is WorkerPhase.RUNNING for w in workers):
            return None
        # The late step is the one after the checkpoint the launch resumed from (the task's own
        # step is the furthest any generation reached: a relaunch trains some steps again).
        first = task.checkpoint_step + 1
        began = self.session_began(task, workers)
        if began is None:  # a worker still starting: stuck (importing, loading) past the timeout
            since = launch_began(workers)
            if now - since > limits.start_timeout_s:
                return self._hung(task, now, first, since, limits.start_timeout_s, launching=True)
            return None
        late_launches = self.first_step_late.setdefault(task.name, set())
        misses = len(late_launches - {task.generation})
        allowed_s = first_step_allowance(limits, self.first_steps.get(task.name), misses)
        if now - began > allowed_s:
            late_launches.add(task.generation)
            return self._hung(task, now, first, began, allowed_s, launching=True)
        return None

    def session_began(self, task: TaskRecord, workers: Sequence[WorkerRecord]) -> float | None:
        """When the last worker of the task's launch was first seen in its training session (a
        position of this generation reported); None while one has not been. Never later than the
        launch plus ``start_timeout_s``: a coordinator that took over (or restarted) sees every
        session for the first time, and had the sessions begun later than that, the start would
        have been found stuck; so a first step's deadline is not put off by a new leader."""
        seen = [self.in_session.get((task.name, w.pid)) for w in workers if w.pid is not None]
        began = [at for generation, at in filter(None, seen) if generation == task.generation]
        if len(began) < len(workers):
            return None
        return min(max(began), launch_began(workers) + self.ctx.limits.start_timeout_s)

    def first_step_done(self, task: TaskRecord, ended: float) -> None:
        """The first step of the task's current generation ended at ``ended``: a launch's is
        measured from its sessions' start (``first_step_allowance``); a generation re-formed in
        place is no launch. A launch whose workers reported no position (a program without the
        training library's session) is measured from its launch, the only start known."""
        workers = self.ctx.store.workers(task.name, task.generation)
        if task.launched_generation != task.generation or not workers:
            return
        began = self.session_began(task, workers)
        took = max(0.0, ended - (launch_began(workers) if began is None else began))
        self.first_step_late.pop(task.name, None)
        self.first_steps[task.name] = max(took, self.first_steps.get(task.name, 0.0))

    def standing_aside(self, key: tuple[str, int], now: float) -> bool:
        """Whether a generation's lateness is not to be judged now: the coordinator just stalled
        (what was done meanwhile is still on its way), a failure of it is being handled, or its
        peers are being probed."""
        return now < self.judging_from or self.handled.awaiting_cause(key) or key in self.checks

    def check_hang(self, task: TaskRecord, now: float) -> Failing | None:
        key = (task.name, task.generation)
        monitor = self.monitor(task.name, task.generation)
        monitor.watch_from(now, task.step)  # (from a start, while judging waits: ``started``)
        if self.standing_aside(key, now):
            return None
        if task.step >= self.ctx.spec(task.name).run.iterations:
            return None  # training is over; the workers are saving and exiting
        grace = self.graced.get(key)
        if grace is not None and grace.step == monitor.last_step + 1 and now < grace.until:
            return None  # a slow network's grace
        # One heartbeat more: the report of a step that did end may still be on its way.
        if not monitor.late(now - self.ctx.pace.judged(now).interval_s):
            return None
        return self._hung(task, now, monitor.last_step + 1, monitor.since, monitor.deadline())

    def hang_incident(self, key: GenerationKey) -> int | None:
        """The incident opened for the generation's hang, if any."""
        return self.hang_incidents.get(key)

    def restore_step_times(self, kept: StepTimes) -> None:
        """The step times a predecessor measured: hangs are judged from a task's first steps."""
        self.restored = dict(kept.tasks)

    def opened(self, key: GenerationKey, incident: int) -> None:
        """Recovery opened ``incident`` for the generation's hang: stacks reported for the
        generation from now on are that incident's."""
        self.hang_incidents[key] = incident

    def _deferred(self, task: TaskRecord, step: int, waited_s: float, not_yet: NotYet) -> None:
        """Say once per late step that it is not judged yet, and why (``hang_verdict``)."""
        if self.deferred.get(task.name) == (task.generation, step):
            return
        self.deferred[task.name] = (task.generation, step)
        self.ctx.act.record(
            "hang_deferred",
            task=task.name,
            step=step,
            waited_s=round(waited_s, 3),
            why=not_yet.why,
            silent_s={h: round(s, 3) for h, s in not_yet.silent_s.items()},
            generation=task.generation,
        )

    def _hung(
        self,
        task: TaskRecord,
        now: float,
        step: int,
        since: float,
        deadline_s: float,
        launching: bool = False,
    ) -> Failing | None:
        """``step`` is late (nothing since ``since``; ``launching``: a launch's first): name the
        hung ranks, record every rank's stack, kill the culprits and say what failed. With no
        culprit and several nodes, the agents probe each other first (``peercheck``): the verdict
        waits for their answer; a launch stuck starting up fails with its ranks unknown (a
        relaunch)."""
        workers, limits = self.ctx.store.workers(task.name, task.generation, live=True), self.ctx.limits
        seen = {n.name: n.last_seen for n in self.ctx.store.nodes()}
        observed = self.observed(workers)
        passed = trained_past(workers, {k: seen.at for k, seen in observed.items()}, task.generation)
        if passed is not None and passed >= step:
            self.monitor(task.name, task.generation).seen_past(passed, now)
            return None
        interval = self.ctx.pace.judged(now).interval_s
        mean_s = self.monitor(task.name, task.generation).mean_interval() or 0.0
        settled_s = settled_for(mean_s, deadline_s, interval, launching)
        capped = now - since >= limits.hang_cap_s
        verdict = hang_verdict(workers, seen, observed, now, interval, settled_s, launching, capped)
        if isinstance(verdict, NotYet):
            self._deferred(task, step, now - since, verdict)
            return None
        culprits, grace = verdict.culprits, self.graced.get((task.name, task.generation))
        endpoints = None
        by_then_s = now - since + limits.network_grace_s
        graces_spent = grace is not None and not grace.again(step, by_then_s, limits)
        if not culprits and not graces_spent and not verdict.starting:
            endpoints = probe_endpoints(self.ctx.store.nodes(), {w.node for w in workers})
        # Every rank's stack first (the agents carry this out before the stop that follows).
        self.ctx.act.dump_stacks(task.name, task.generation, endpoints)
        self._said_hung(task, step, since, now, deadline_s, mean_s, verdict, endpoints is not None)
        if endpoints is not None:
            self.checks[(task.name, task.generation)] = PeerCheck.of(workers, step, since, verdict.why, now)
            return None
        if not culprits and graces_spent and grace is not None and not verdict.starting:
            return stuck(task, step, since, grace, verdict.why)
        # Kill the hung worker(s) at once: the hang becomes an ordinary death.
        for w in culprits:
            self.ctx.act.stop_worker(w, 0.0)
        return Failing(
            task.name,
            task.generation,
            ErrorKind.TASK_HANG,
            culprits[0].node if culprits else None,
            f"step {step} late; hung rank(s) {[w.rank for w in culprits] or 'unknown'}: {verdict.why}",
            failed=frozenset(w.rank for w in culprits) or None,
            seen_at=since,
            hang=True,
        )

    def _said_hung(
        self,
        task: TaskRecord,
        step: int,
        since: float,
        now: float,
        deadline_s: float,
        mean_s: float,
        verdict: HangVerdict,
        peer_check: bool,
    ) -> None:
        """Record a late step judged: how late, against what, who is blamed and why, where each
        rank was and for how long when last read."""
        self.ctx.act.record(
            "hang_detected",
            task=task.name,
            step=step,
            mean_s=round(mean_s, 4),
            waited_s=round(now - since, 3),
            deadline_s=round(deadline_s, 3),
            culprits=[w.rank for w in verdict.culprits],
            why=verdict.why,
            where=verdict.where,
            held_s={rank: round(h, 3) for rank, h in verdict.held_s.items()},
            generation=task.generation,
            peer_check=peer_check,
        )

    # ------------------------------------------------------------------ peer checks
    def stacks_reported(self, report: StacksReport) -> bool:
        """Take a stacks report that answers a peer check (True); the check is judged once
        complete (``judge_checks``)."""
        check = self.checks.get((report.task, report.generation))
        if check is None:
            return False
        check.add(report)
        return True

    def judge_checks(self, now: float) -> list[Judged]:
        judged = []
        for key, check in list(self.checks.items()):
            if check.complete(now):
                del self.checks[key]
                judged.append(self._judged(check, now))
        return judged

    def _judged(self, check: PeerCheck, now: float) -> Judged:
        """What the complete check decides (``peercheck.outcome``): a grace for a slow network,
        or the failure to recover from."""
        key = (check.task, check.generation)
        decided = outcome(check, self.ctx.limits.network_grace_s)
        self.ctx.act.record(
            "peer_check",
            task=check.task,
            generation=check.generation,
            step=check.step,
            culprits=list(decided.verdict.culprits),
            why=decided.verdict.why,
            unreachable=check.unreachable,
            grace_s=decided.grace_s,
            retransmitting=check.retransmitting,
        )
        task = self.ctx.store.task(check.task)
        failing = None
        if decided.grace_s > 0:
            given = self.graced.get(key)
            until = now + decided.grace_s
            self.graced[key] = (
                Grace(check.step, until, decided.renewable)
                if given is None
                else given.following(check.step, until, decided.renewable)
            )
        elif task is not None and task.generation == check.generation and not self.handled.has_incident(key):
            failed = None if decided.failed is None else frozenset(decided.failed)
            kind, node = decided.kind, decided.node
            failing = Failing(
                check.task, check.generation, kind, node, decided.why, failed, check.since, hang=True
            )
        return Judged(key, failing, tuple(check.stacks))

"""Detection signals judged on the coordinator's tick: silent nodes, late steps (hangs), workers
that never started, isolation that has run out.

Exits, exceptions and iteration reports arrive with heartbeats (``coordinator.py``); this module
judges what only time can tell. Each judgement is a pure function of records and ``now``; the
``Detector`` returns what it finds (silent nodes, :class:`Failing` generations), and the
coordinator hands that to recovery: detection decides what failed, recovery what to do about it.
Detection reads whether a generation is being handled through :class:`Handled`, a read-only
view recovery provides, and imports nothing of recovery.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from unicron.control.context import Context
from unicron.control.detect.hangs import WorkerKey, hang_verdict, unheard
from unicron.control.detect.monitor import TaskMonitor
from unicron.control.detect.peercheck import STUCK, PeerCheck, outcome, probe_endpoints
from unicron.control.detect.silence import (
    BEHIND,
    BEHIND_SHARE,
    CAUGHT_UP_SHARE,
    QUIET_INTERVALS,
    QUIET_SHARE,
    BeatDelays,
    Lateness,
    SilenceJudge,
    Verdict,
)
from unicron.control.store.records import NodeRecord, TaskRecord, WorkerRecord
from unicron.core.cadence import JITTER
from unicron.core.kept import StepTimes
from unicron.core.protocol import (
    AGENT_REQUEST_TIMEOUT_S,
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
LATENESS_KEPT_S = 600.0  # how far back the coordinator's lateness is looked up (a silence longer
# than that is judged with the lateness of the last ten minutes only)
HELD_NAMED = 20  # nodes named in one node_loss_held event (the count says how many)
# How often, per heartbeat interval, the nodes are looked over for silence (and the heartbeats'
# waits for the coordinator's lag): each look reads every node, which at thousands of nodes ten
# times a second was a tenth of the coordinator's loop; a loss is found this much later at most.
SWEEPS_PER_INTERVAL = 5


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
class Silent:
    """A node to declare lost: silent ``silent_s`` since it was last heard, of which ``late_s``
    was the coordinator's own lateness (``silence.Lateness``: not counted against it), judged by
    a deadline of ``deadline_s`` (the cluster's, ``core/cadence.py``). The loss records all three,
    so that it says why the node, and not the coordinator, was at fault."""

    node: str
    silent_s: float
    late_s: float
    deadline_s: float


@dataclass(frozen=True)
class Holding:
    """What holds node losses back now (``silence.py``): what operators are shown."""

    by_hand: bool  # an admin holds every loss
    alarm: str | None  # a mass silence or the coordinator far behind, while its alarm holds
    domains: tuple[str, ...]  # failure domains partly silent, whose silent nodes are held
    nodes: int  # silent nodes held at the last look

    @property
    def any(self) -> bool:
        return self.by_hand or self.alarm is not None or bool(self.domains) or self.nodes > 0


@dataclass(frozen=True)
class Judged:
    """A peer check complete: the failure it found (None: graced, or handled meanwhile), and
    the stacks the check gathered, recorded with the incident once it is open."""

    key: GenerationKey
    failing: Failing | None
    stacks: tuple[StacksReport, ...]


def silent_nodes(
    nodes: Sequence[NodeRecord],
    now: float,
    listening_since: float,
    deadline_s: float,
    late_since: Callable[[float], float] = lambda then: 0.0,
) -> list[tuple[str, float]]:
    """Nodes not heard within ``deadline_s`` (the cluster's now: ``core/cadence.py``). A node
    not heard since the service could hear them at all (it started, took over, or resumed from
    a stall) is counted from then plus the agents' longest pause between retries: its agent,
    failing meanwhile, may be in that pause. So is a
    node heard only within an agent's request timeout of then: what was read may be a request
    its agent gave up on during a stall (read from the listen backlog after the resume; a
    healthy node was lost 2.6 s after a 20 s SIGSTOP that way), its agent still pausing.
    ``late_since(t)``: the longest the coordinator's own loop was late after ``t``
    (``silence.Lateness``): the node's heartbeats may have waited that long, not counted against it."""
    out = []
    fresh_from = listening_since + AGENT_REQUEST_TIMEOUT_S
    for node in nodes:
        heard = node.last_seen if node.last_seen >= fresh_from else listening_since + AGENT_RETRY_CAP_S
        heard = max(heard, node.last_seen)
        silent = now - heard  # (what the loss records: its last heartbeat is when the fault began)
        if node.state is not NodeState.LOST and silent - late_since(heard) > deadline_s:
            out.append((node.name, silent))
    return out


def stalled_for(last_tick: float | None, now: float, limits: Settings) -> float | None:
    """How long the coordinator itself did not run (a SIGSTOP, a long pause of its process, an
    overloaded host, a request that blocked its loop), when that is longer than two heartbeat
    intervals (its loop ticks ten times a second); else None. Heartbeats could not be read
    meanwhile, so what went silent during it says nothing of the nodes."""
    if last_tick is None:
        return None
    gap = now - last_tick
    return gap if gap > 2 * limits.heartbeat_interval_s else None


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


def launch_began(workers: Sequence[WorkerRecord]) -> float:
    """When a launch's last worker was ordered: a first step is timed from then."""
    return max(w.launched for w in workers)


def first_step_allowance(limits: Settings, measured_s: float | None, misses: int = 0) -> float:
    """How long a launch's first step may take once its workers all run (there are no step times
    of it yet). A task's first launch: ``first_step_timeout_s``, long, as loading and compiling
    may take minutes. A relaunch is the same program on the same data, now also loading a
    checkpoint: ``hang_multiple`` times the longest first step of its earlier launches
    (``measured_s``) plus ``checkpoint_allowance_s``, if shorter (before: ten minutes by default
    to find a rank hung in the first step after every relaunch). Never under
    ``heartbeat_deadline_s``: a node's loss is decided before a hang. Doubled for each relaunch
    in a row whose first step was found late (``misses``): a host slower now than at the first
    launch (loaded, its disk or page cache cold) would otherwise be relaunched forever, each
    launch cut off before its start-up ends (seen in the soak with both cores busy: 15 s allowed,
    four workers importing torch on two loaded cores, twenty relaunches)."""
    if measured_s is None:
        return limits.first_step_timeout_s
    derived = (limits.hang_multiple * measured_s + limits.checkpoint_allowance_s) * 2.0 ** min(misses, 32)
    return min(limits.first_step_timeout_s, max(derived, limits.heartbeat_deadline_s))


@dataclass
class Detector:
    ctx: Context
    handled: Handled
    monitors: dict[tuple[str, int], TaskMonitor] = field(default_factory=dict)
    # What each worker process last reported, by (task, pid): whether it is stopped (SIGSTOP), and
    # where it is. By process, not by rank: a survivor renamed into a new generation is reported
    # under its old identity until its agent has carried the rename out.
    processes: dict[tuple[str, int], tuple[bool, Progress | None]] = field(default_factory=dict)
    hang_incidents: dict[tuple[str, int], int] = field(default_factory=dict)  # (task, gen) -> incident
    checks: dict[tuple[str, int], PeerCheck] = field(default_factory=dict)  # hangs awaiting a peer probe
    graced: dict[tuple[str, int], Grace] = field(default_factory=dict)
    listening_since: float | None = None
    judging_from: float = 0.0  # after a stall of the coordinator, hangs are judged from then
    deferred: dict[str, tuple[int, int]] = field(default_factory=dict)  # task -> (gen, step) said deferred
    restored: dict[str, list[float]] = field(default_factory=dict)  # step times kept by a predecessor
    # task -> the longest a launch of it took from its last worker's launch to its first step
    # (this coordinator's own measurements: after a restart, relaunches get the full timeout)
    first_steps: dict[str, float] = field(default_factory=dict)
    # task -> the launches (generations) in a row whose first step was found late (each doubles
    # the allowance of the next)
    first_step_late: dict[str, set[int]] = field(default_factory=dict)
    # Whose fault a silence is (``silence.py``): the coordinator's own lateness (the longest it
    # was late, over ``LATENESS_KEPT_S``), its heartbeats' waits, the mass-silence alarm and the
    # loss rate.
    lateness: Lateness = field(default_factory=lambda: Lateness(LATENESS_KEPT_S))
    delays: BeatDelays = field(init=False)
    silence: SilenceJudge = field(init=False)
    held: set[str] = field(default_factory=set)  # silent nodes not declared lost (said once each)
    _holding: Holding = field(default=Holding(False, None, (), 0), repr=False)  # as of the last look
    swept_at: float = -math.inf  # when the nodes were last looked over for silence
    lag: tuple[float, float] = (-math.inf, 0.0)  # (when, what) the heartbeats' waits last said

    def __post_init__(self) -> None:
        self.silence = SilenceJudge(self.ctx.limits)
        deadline = self.ctx.limits.heartbeat_deadline_s
        self.delays = BeatDelays(cap_s=deadline, window_s=deadline)

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

    def worker_seen(self, state: WorkerState, now: float) -> None:
        """What a heartbeat says of a worker process: whether it is stopped, and where it is
        (saving a checkpoint: the step after it is late counted from now, ``TaskMonitor.since``)."""
        where = state.progress
        self.processes[(state.task, state.pid)] = (state.stopped and state.running, where)
        if where is not None and where.phase is Phase.CHECKPOINT:
            monitor = self.monitors.get((state.task, where.generation))
            if monitor is not None:
                monitor.saving(where.step, now)

    def observed(self, workers: Sequence[WorkerRecord]) -> dict[WorkerKey, tuple[bool, Progress | None]]:
        """Whether each worker is stopped, and where it is, as its process last reported (under
        whichever identity its agent knew it by)."""
        return {
            w.key: self.processes.get((w.task, w.pid), (False, None)) for w in workers if w.pid is not None
        }

    def positions(self, workers: Sequence[WorkerRecord]) -> dict[WorkerKey, Progress | None]:
        return {key: where for key, (_, where) in self.observed(workers).items()}

    def forget(self, name: str) -> None:
        self.monitors = {k: v for k, v in self.monitors.items() if k[0] != name}
        self.processes = {k: v for k, v in self.processes.items() if k[0] != name}
        self.checks = {k: v for k, v in self.checks.items() if k[0] != name}
        self.graced = {k: v for k, v in self.graced.items() if k[0] != name}
        self.deferred.pop(name, None)
        self.restored.pop(name, None)

    def late(self, now: float, late_s: float) -> None:
        """A tick at ``now`` that the loop came to ``late_s`` later than planned: the coordinator
        is as late as that or as the heartbeats it reads waited, whichever is more."""
        if now - self.lag[0] >= self._sweep_every(now) or now < self.lag[0]:
            self.lag = (now, self.delays.lag(now))
        self.lateness.add(now, max(late_s, self.lag[1]))

    def late_s(self, now: float) -> float:
        """How late the coordinator has been over the last heartbeat deadline: what a node's
        silence is not counted against it for, were it last heard a deadline ago (operators
        watch it: ``unicron_coordinator_late_seconds``)."""
        return self.lateness.since(now - self.ctx.pace.judged(now).deadline_s)

    def _sweep_every(self, now: float) -> float:
        # (less a millisecond: ticks a tenth of a second apart on a float clock are not skipped)
        return self.ctx.pace.judged(now).interval_s / SWEEPS_PER_INTERVAL - 1e-3

    def heard(self, node: str, sent: float | None, waited_s: float | None, now: float) -> None:
        """A heartbeat its agent sent at ``sent``, ``waited_s`` after its last answered one (None:
        it did not say), was read ``now``."""
        if sent is not None:
            # (an agent's wait is its interval give or take its jitter: not the coordinator's lag)
            longest = self.ctx.pace.judged(now).interval_s * (1 + JITTER)
            unanswered = max(0.0, (waited_s or 0.0) - longest)
            self.delays.heard(node, now - sent, unanswered, now)

    def silent(self, now: float) -> list[Silent]:
        """The nodes to declare lost now, with how long each was silent: those past their
        deadline (``silent_nodes``), unless the silence is a mass silence, a failure domain's
        partial silence, or the loss rate is spent (``silence.SilenceJudge``); what is held,
        and the alarms, are recorded."""
        if self.listening_since is None:
            self.listening_since = now
        if now - self.swept_at < self._sweep_every(now) and now >= self.swept_at:
            return []
        self.swept_at = now
        nodes = self.ctx.store.nodes()
        in_service = sum(n.state is not NodeState.LOST for n in nodes)
        self.ctx.pace.nodes_in_service(in_service, now)
        deadline = self.ctx.pace.judged(now).deadline_s
        self.delays.cap_s = self.delays.window_s = deadline
        since, late = self.listening_since, self.lateness.since
        past = silent_nodes(nodes, now, since, deadline, late)
        # A rising silence (``silence.py``): counted only while a node is past its deadline.
        quiet_s = max(QUIET_SHARE * deadline, QUIET_INTERVALS * self.ctx.pace.judged(now).interval_s)
        quiet = len(silent_nodes(nodes, now, since, quiet_s, late)) if past and quiet_s < deadline else 0
        domains = {n.name: n.domain for n in nodes if n.domain and n.state is not NodeState.LOST}
        lag, alarm = self.lag[1], self.silence  # (the heartbeats' waits: ``late``)
        holding = alarm.alarm_since is not None and alarm.alarm_why == BEHIND
        behind = lag >= BEHIND_SHARE * deadline or (holding and lag >= CAUGHT_UP_SHARE * deadline)
        grace_s = AGENT_RETRY_CAP_S + deadline
        verdict = self.silence.judge(past, in_service, now, domains, grace_s, behind, quiet)
        self._domain_alarms(verdict)
        act = self.ctx.act
        if verdict.alarm_began:
            share, lag = round(len(past) / max(1, in_service), 3), round(self.lag[1], 3)
            said: dict[str, Any] = {"share": share, "why": verdict.alarm_why, "lag_s": lag}
            said["quiet"] = quiet  # unheard for QUIET_SHARE of a deadline, the silent among them
            act.record("mass_silence", silent=len(past), in_service=in_service, **said)
        if verdict.alarm_ended is not None:
            act.record("mass_silence_over", seconds=round(verdict.alarm_ended, 3), silent=len(past))
            if verdict.grace:  # the nodes still silent get a restart's grace (their agents may back off)
                self.listening_since = now
        alarm_held = verdict.alarm_why if verdict.alarm_holds else None  # (not once past its hold)
        whole = "held by hand" if self.silence.by_hand else alarm_held
        newly: dict[str, list[str]] = {}  # why -> nodes held from now
        for name in sorted(set(verdict.held) - self.held):
            in_held_domain = domains.get(name) in verdict.domains_held
            why = whole or ("domain silence" if in_held_domain else "node loss rate spent")
            newly.setdefault(why, []).append(name)
        for why, names in newly.items():  # one event for all held at once (a mass silence holds thousands)
            where = sorted({domains[n] for n in names if n in domains}) if why == "domain silence" else None
            act.record("node_loss_held", why=why, nodes=names[:HELD_NAMED], count=len(names), domains=where)
        self.held = set(verdict.held)
        self._holding = Holding(False, alarm_held, tuple(sorted(verdict.domains_held)), len(self.held))
        return [Silent(name, s, self.lateness.since(now - s), deadline) for name, s in verdict.lost]

    def _domain_alarms(self, verdict: Verdict) -> None:
        """A failure domain partly silent, and heard again: recorded (``silence.py``)."""
        for domain, silent, members in verdict.domains_began:
            self.ctx.act.record("domain_silence", domain=domain, silent=silent, in_service=members)
        for domain, seconds in verdict.domains_ended:
            self.ctx.act.record("domain_silence_over", domain=domain, seconds=round(seconds, 3))

    def resumed(self, now: float, stalled_s: float) -> None:
        """The coordinator ran again after ``stalled_s`` without: every node gets a full
        heartbeat deadline from now (as after a restart), and steps are judged late only once
        every agent had time to deliver what its workers did meanwhile (they trained on:
        nothing about them needs the coordinator)."""
        self.listening_since = now
        self.delays.clear()  # (the stall's own grace covers it: not counted twice)
        self.judging_from = now + self.ctx.pace.judged(now).deadline_s
        self.ctx.act.record("coordinator_stalled", seconds=round(stalled_s, 3), grace_until=self.judging_from)

    def check_start(self, task: TaskRecord, now: float) -> Failing | None:
        """A launch: every worker must start within ``launch_timeout_s``, and once all run, the
        first step must end within ``first_step_timeout_s`` (the step-time statistics that find
        a hang later do not exist yet, so without this a rank hung in it stalls the task)."""
        if now < self.judging_from:
            return None  # the coordinator just stalled: the agents' reports are still on their way
        workers = self.ctx.store.workers(task.name, task.generation)
        limits = self.ctx.limits
        late = [w for w in workers if now - w.launched > limits.launch_timeout_s]
        stale = [w for w in late if w.state is WorkerPhase.LAUNCHING]
        if stale:
            why = f"{len(stale)} worker(s) never started"
            return Failing(task.name, task.generation, ErrorKind.EXITED_ABNORMALLY, None, why)
        key = (task.name, task.generation)
        handled = self.handled.has_incident(key) or self.handled.awaiting_cause(key) or key in self.checks
        if task.launched_generation != task.generation or handled or not workers:
            return None  # an in-place generation: its incident's deadline covers it
        since = launch_began(workers)
        late_launches = self.first_step_late.setdefault(task.name, set())
        misses = len(late_launches - {task.generation})
        allowed_s = first_step_allowance(limits, self.first_steps.get(task.name), misses)
        if all(w.state is WorkerPhase.RUNNING for w in workers) and now - since > allowed_s:
            late_launches.add(task.generation)
            # The late step is the one after the checkpoint the launch resumed from (the task's own
            # step is the furthest any generation reached: a relaunch trains some steps again).
            return self._hung(task, now, task.checkpoint_step + 1, since, allowed_s)
        return None

    def first_step_done(self, task: TaskRecord, ended: float) -> None:
        """The first step of the task's current generation ended at ``ended``: a launch's is
        measured (``first_step_allowance``); a generation re-formed in place is no launch."""
        workers = self.ctx.store.workers(task.name, task.generation)
        if task.launched_generation != task.generation or not workers:
            return
        took = max(0.0, ended - launch_began(workers))
        self.first_step_late.pop(task.name, None)
        self.first_steps[task.name] = max(took, self.first_steps.get(task.name, 0.0))

    def standing_aside(self, key: tuple[str, int], now: float) -> bool:
        """Whether a generation's lateness is not to be judged now: the coordinator just stalled
        (what was done meanwhile is still on its way), a failure of it is being handled, or its
        peers are being probed."""
        return now < self.judging_from or self.handled.awaiting_cause(key) or key in self.checks

    def check_hang(self, task: TaskRecord, now: float) -> Failing | None:
        key = (task.name, task.generation)
        if self.standing_aside(key, now):
            return None
        if task.step >= self.ctx.spec(task.name).run.iterations:
            return None  # training is over; the workers are saving and exiting
        monitor = self.monitor(task.name, task.generation)
        monitor.watch_from(now, task.step)
        grace = self.graced.get(key)
        if grace is not None and grace.step == monitor.last_step + 1 and now < grace.until:
            return None  # a slow network's grace
        # One heartbeat more: the report of a step that did end may still be on its way.
        if not monitor.late(now - self.ctx.pace.judged(now).interval_s):
            return None
        return self._hung(task, now, monitor.last_step + 1, monitor.since, monitor.deadline())

    def registered(self, node: str) -> None:
        """The node (re)registered: its next heartbeat sets its clock's floor anew."""
        self.delays.forget(node)

    def hold_losses(self, held: bool) -> None:
        """An admin holds every node loss, or releases the hold (``silence.py``)."""
        self.silence.by_hand = held

    def holding(self) -> Holding:
        """What held node losses back at the last look over the nodes (an admin's hold: now)."""
        return replace(self._holding, by_hand=self.silence.by_hand)

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

    def _deferred(self, task: TaskRecord, step: int, waited_s: float, silent: dict[str, float]) -> None:
        """Say once per late step that it is not judged yet: a node of the task is silent, and
        whether it is lost is decided first (``hang_verdict``)."""
        if self.deferred.get(task.name) == (task.generation, step):
            return
        self.deferred[task.name] = (task.generation, step)
        self.ctx.act.record(
            "hang_deferred",
            task=task.name,
            step=step,
            waited_s=round(waited_s, 3),
            silent_s={h: round(s, 3) for h, s in silent.items()},
            generation=task.generation,
        )

    def _hung(
        self, task: TaskRecord, now: float, step: int, since: float, deadline_s: float
    ) -> Failing | None:
        """``step`` is late (nothing since ``since``): name the hung ranks, record every rank's
        stack, kill the culprits and say what failed. With no culprit and several nodes, the
        agents probe each other first (``peercheck``): the verdict waits for their answer."""
        workers, limits = self.ctx.store.workers(task.name, task.generation, live=True), self.ctx.limits
        seen = {n.name: n.last_seen for n in self.ctx.store.nodes()}
        observed = self.observed(workers)
        stopped = {key: halted for key, (halted, _) in observed.items()}
        interval = self.ctx.pace.judged(now).interval_s
        verdict = hang_verdict(
            workers, seen, stopped, {k: at for k, (_, at) in observed.items()}, now, interval
        )
        if verdict is None:
            self._deferred(task, step, now - since, unheard(workers, seen, now, interval))
            return None
        culprits, grace = verdict.culprits, self.graced.get((task.name, task.generation))
        endpoints = None
        by_then_s = now - since + limits.network_grace_s
        graces_spent = grace is not None and not grace.again(step, by_then_s, limits)
        if not culprits and not graces_spent:
            endpoints = probe_endpoints(self.ctx.store.nodes(), {w.node for w in workers})
        # Every rank's stack first (the agents carry this out before the stop that follows).
        self.ctx.act.dump_stacks(task.name, task.generation, endpoints)
        self.ctx.act.record(
            "hang_detected",
            task=task.name,
            step=step,
            mean_s=round(self.monitor(task.name, task.generation).mean_interval() or 0.0, 4),
            waited_s=round(now - since, 3),
            deadline_s=round(deadline_s, 3),
            culprits=[w.rank for w in culprits],
            why=verdict.why,
            where=verdict.where,
            generation=task.generation,
            peer_check=endpoints is not None,
        )
        if endpoints is not None:
            self.checks[(task.name, task.generation)] = PeerCheck.of(workers, step, since, verdict.why, now)
            return None
        if not culprits and graces_spent and grace is not None:
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

"""Recovery: incidents, the severity ladder's decision carried out, and the root cause.

The first sign of a failure in a generation opens its *incident*; later signs (the peers'
connection errors, the exits that follow) belong to it. The fault is attributed to its scope
first (``attribute``: a worker, its node, the task itself or the checkpoint storage), so that
only worker and node faults count against a node. The ladder (``core/ladder.py``) then picks the
action; recovery is in place when the failed ranks are known and enough survivors remain (they
form the next generation), else a restart of the task from its newest checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from unicron.control.context import Context
from unicron.control.effects import Effect, Isolate, StopGeneration, TaskDown
from unicron.control.generations import Generations
from unicron.control.hangs import WorkerKey, not_arrived
from unicron.control.records import EventRecord, TaskRecord, WorkerRecord
from unicron.control.response import (
    IN_PROCESS,
    RESTART_FAILED,
    RESTART_FROM_CHECKPOINT,
    TASK_ENDED,
    TASK_FAILED,
    Failure,
    in_place,
    isolation,
    respond,
)
from unicron.core.ladder import Decision as LadderDecision
from unicron.core.ladder import Ladder
from unicron.core.protocol import IterationReport, Progress
from unicron.core.states import TaskState
from unicron.core.taxonomy import TAXONOMY, ErrorKind, Scope, error_kind

# Kinds that a peer's failure produces in the survivors: an incident opened by one of these may
# turn out to have a deeper cause.
CONSEQUENCES = frozenset(
    {
        ErrorKind.CONNECTION_RESET,
        ErrorKind.CONNECTION_REFUSED,
        ErrorKind.OTHER_NETWORK_ERROR,
        ErrorKind.NCCL_TIMEOUT,
        ErrorKind.EXITED_ABNORMALLY,
    }
)


@dataclass(frozen=True)
class Sign:
    """One sign of a fault: when it was seen, what it was, where, and the generation the failing
    worker was in (None: not known, e.g. a node's silence)."""

    time: float
    kind: ErrorKind
    node: str | None
    generation: int | None = None


def attribute(sign: Sign, recent: Sequence[Sign], window: float) -> Scope:
    """The scope of a fault: its kind's, except that a worker fault that also struck the same
    task on another node within ``window``, in the same generation, is the task's own (a node
    fault does not crash processes on two machines at once). A worker that had gone on into a
    later generation (it survived the first fault and took part in the recovery) and failed
    there is a new failure, not the first one striking again."""
    scope = TAXONOMY[sign.kind].scope
    if scope is not Scope.WORKER or sign.node is None:
        return scope
    same = [
        r
        for r in recent
        if r.kind is sign.kind and sign.time - r.time <= window and r.node not in (None, sign.node)
    ]
    together = [r for r in same if None in (r.generation, sign.generation) or r.generation == sign.generation]
    return Scope.TASK if together else Scope.WORKER


def reopened(events: Sequence[EventRecord]) -> list[tuple[int, Incident]]:
    """The incidents in ``events`` that no outcome closed (but the storage's: its own watch keeps
    those, ``storagewatch``), with the generation each struck and the actions taken so far."""
    closed = {e.detail.get("incident") for e in events if e.kind == "outcome"}
    found: dict[int, tuple[int, Incident]] = {}
    for e in events:
        if e.kind == "incident" and e.id not in closed and e.detail.get("scope") != Scope.STORAGE.value:
            kind, action = error_kind(str(e.detail.get("kind"))), str(e.detail.get("action"))
            found[e.id] = (int(e.detail.get("generation", 0)), Incident(e.id, kind, e.time, action))
        elif e.kind in ("in_process_recovery", "escalation") and e.detail.get("incident") in found:
            incident = found[e.detail["incident"]][1]
            if e.kind == "escalation":  # as _escalate: the action under way changes
                incident.action = str(e.detail["to_action"])
            incident.actions.append(IN_PROCESS if e.kind == "in_process_recovery" else incident.action)
    for _, incident in found.values():
        incident.actions = incident.actions or [incident.action]
    return list(found.values())


@dataclass
class Incident:
    id: int
    kind: ErrorKind
    detected: float
    action: str  # the action now under way
    actions: list[str] = field(default_factory=list)  # every action taken, in order
    deadline: float | None = None  # an in-process recovery must regain a step by then
    stuck_nodes: set[str] = field(default_factory=set)  # where members stuck in a recovery ran


@dataclass
class Recovery:
    ctx: Context
    generations: Generations
    ladder: Ladder
    released: Callable[[str], None]  # the coordinator frees everything of an ended task
    incidents: dict[tuple[str, int], Incident] = field(default_factory=dict)  # the open one per generation
    faults: dict[tuple[str, int], float] = field(default_factory=dict)  # injection time per generation
    # (task, generation) -> (since, kind, node): a survivor saw a peer fail; the cause is due
    awaiting: dict[tuple[str, int], tuple[float, ErrorKind, str | None]] = field(default_factory=dict)
    awaiting_ranks: dict[tuple[str, int], set[int]] = field(default_factory=dict)
    recent: dict[str, list[Sign]] = field(default_factory=dict)  # every sign of a fault, per task
    isolated_until: dict[str, float] = field(default_factory=dict)
    last_incident: dict[str, int] = field(default_factory=dict)  # per task, open or closed
    task_faults: dict[tuple[str, ErrorKind], list[float]] = field(default_factory=dict)

    def peer_error(
        self, name: str, generation: int, kind: ErrorKind, node: str, rank: int, seen_at: float | None
    ) -> None:
        """A survivor's view of a peer's failure: wait (briefly) for the cause, which names the
        failed rank, so that the survivors can go on without it."""
        key = (name, generation)
        self.awaiting.setdefault(key, (seen_at or self.ctx.clock(), kind, node))
        since = self.awaiting[key][0]
        reporting = self.awaiting_ranks.setdefault(key, set())
        reporting.add(rank)
        if len(reporting) >= len(self.ctx.store.workers(name, generation, live=True)):
            # Every member is alive and waiting: a broken connection, not a death.
            # Reattempt in place: the same members rebuild their group.
            self.incident(
                name, kind, node, "every rank lost its connections; all alive", failed=set(), seen_at=since
            )

    def incident(
        self,
        name: str,
        kind: ErrorKind,
        node: str | None,
        why: str,
        failed: set[int] | None = None,
        seen_at: float | None = None,
        scope: Scope | None = None,
        generation: int | None = None,
        seen_as: str = "first report",
    ) -> None:
        """Open the generation's incident (once) and carry out the ladder's decision. ``failed``:
        the ranks known to be gone (without them the survivors cannot be told apart);
        ``seen_at``: when the symptom happened (``seen_as`` says what that time is), for the
        detection time when no fault was injected; ``generation``: the one the failing worker
        was in, if known (for ``attribute``)."""
        now = self.ctx.clock()
        task = self.ctx.store.get_task(name)
        fresh = task.state is TaskState.STARTING and task.launched_generation == task.generation
        if scope is None and fresh:
            # A freshly launched generation failing before its first step: the program, its
            # data or its configuration, not the machine (hardware kinds keep their node scope).
            scope = Scope.TASK if TAXONOMY[kind].scope is Scope.WORKER else None
        scope = self.note(name, Sign(now, kind, node, generation), scope)
        if (name, task.generation) in self.incidents:
            return
        self._stop_awaiting(name)  # this incident answers every peer error of the task so far
        self.generations.cancel_growth(name)
        decision = self.ladder.decide(name, kind, node, now, scope)
        self.ctx.act.keep("ladder", self.ladder.history())
        incident = self._open(task, kind, node, why, scope, decision, seen_at, seen_as)
        failure = Failure(name, node, why, None if failed is None else frozenset(failed), incident.id)
        may_stay = self.generations.in_place(name)
        snapshot = self.ctx.store.snapshot()
        spec = self.ctx.spec(name)
        response = respond(
            snapshot, failure, decision, may_stay, spec.is_usable, self.ctx.limits, now, spec.replica_size
        )
        incident.actions.append(response.action)
        if response.action == IN_PROCESS:
            incident.deadline = now + self.ctx.limits.recovery_deadline_s
        self._apply(response.effects, now)
        decided = self.ctx.clock()
        self.ctx.act.record(
            "response",
            task=name,
            incident=incident.id,
            action=response.action,
            decided_at=decided,
            decision_s=round(decided - now, 6),
        )
        if response.action == TASK_FAILED:
            del self.incidents[(name, task.generation)]  # its outcome is recorded: task failed
            self.released(name)

    def _apply(self, effects: Sequence[Effect], now: float) -> None:
        self.ctx.act.apply(effects, now)
        for effect in effects:
            if isinstance(effect, Isolate):
                self.isolated_until[effect.node] = effect.until

    def _open(
        self,
        task: TaskRecord,
        kind: ErrorKind,
        node: str | None,
        why: str,
        scope: Scope,
        decision: LadderDecision,
        seen_at: float | None,
        seen_as: str,
    ) -> Incident:
        """Record the generation's incident (the ladder's decision, when the fault began) and
        close the ones it supersedes (a new fault struck while they were being recovered)."""
        now, name, record = self.ctx.clock(), task.name, self.ctx.act.record
        superseded = [k for k in self.incidents if k[0] == name]
        injected = self.faults.get((name, task.generation))
        began = seen_at if injected is None else injected
        incident_id = record(
            "incident",
            task=name,
            node=node,
            kind=kind.value,
            severity=decision.severity.name,
            action=decision.action.label,
            scope=scope.value,
            why=why,
            ladder=decision.why,
            detected_at=now,
            detection_s=None if began is None else round(max(0.0, now - began), 4),
            fault_at=began,
            fault_source="injected" if injected is not None else None if began is None else seen_as,
            generation=task.generation,
            step=task.step,
            checkpoint_step=task.checkpoint_step,
        )
        for key in superseded:
            earlier = self.incidents.pop(key)
            record("outcome", task=name, incident=earlier.id, outcome="superseded", by=incident_id)
        incident = Incident(incident_id, kind, now, decision.action.label)
        self.incidents[(name, task.generation)] = incident
        self.last_incident[name] = incident_id
        return incident

    def note(self, name: str, sign: Sign, scope: Scope | None = None) -> Scope:
        """Note every sign of a fault, also those that join an open incident: the same fault on
        a second node makes it the task's own, and its earlier counts against nodes are taken
        back. Once the task's own, the same kind stays so within the escalation window."""
        window, now, kind = self.ctx.limits.escalation_window_s, sign.time, sign.kind
        recent = [r for r in self.recent.get(name, []) if now - r.time <= window]
        self.recent[name] = [*recent, sign]
        sticky = [t for t in self.task_faults.get((name, kind), []) if now - t <= window]
        scope = scope or attribute(sign, recent, self.ctx.limits.task_fault_window_s)
        if scope is Scope.TASK and not sticky:
            self.ladder.reattribute(name, kind, now)  # the open incident's fault was the task's
            self.ctx.act.keep("ladder", self.ladder.history())
        if scope is Scope.TASK or sticky:
            self.task_faults[(name, kind)] = [*sticky, now]
            scope = Scope.TASK
        self.ctx.act.keep("signs", self.kept_signs())
        return scope

    def kept_signs(self) -> dict[str, Any]:
        """The recent signs and the task-attributed faults, as plain data (a successor that
        takes over attributes the next sign as this coordinator would)."""
        return {
            "recent": {
                n: [[s.time, s.kind.value, s.node, s.generation] for s in signs]
                for n, signs in self.recent.items()
            },
            "task_faults": [[n, k.value, times] for (n, k), times in self.task_faults.items()],
        }

    def restore_signs(self, kept: dict[str, Any]) -> None:
        self.recent = {
            n: [Sign(t, ErrorKind(k), node, g) for t, k, node, g in signs]
            for n, signs in kept.get("recent", {}).items()
        }
        self.task_faults = {(n, ErrorKind(k)): list(times) for n, k, times in kept.get("task_faults", [])}

    def recovered(self, name: str, downtime: float, first: IterationReport) -> None:
        """The task completed ``first``, its first step since it stopped: its incidents are
        recovered (the step's end regained training; the transition ended when its computing
        resumed: the step's start after a relaunch, the group re-formed within it in place)."""
        for (task, generation), incident in list(self.incidents.items()):
            if task == name:
                self.ctx.act.record(
                    "outcome",
                    task=name,
                    incident=incident.id,
                    outcome="recovered",
                    downtime_s=round(downtime, 3),
                    resumed_step=first.step,
                    first_step_ended_at=first.time or self.ctx.clock(),
                    resumed_at=first.resumed_at or None,
                    action=incident.action,
                    actions=incident.actions,
                )
                del self.incidents[(task, generation)]

    def recomputed(self, report: IterationReport) -> None:
        """Survivors computed departed ranks' micro-batches: work the task's latest incident cost."""
        self.ctx.act.record(
            "recomputed",
            task=report.task,
            incident=self.last_incident.get(report.task),
            generation=report.generation,
            rank=report.rank,
            step=report.step,
            micro_batches=report.recomputed,
        )

    def check_deadline(
        self,
        name: str,
        generation: int,
        now: float,
        positions: Callable[[Sequence[WorkerRecord]], Mapping[WorkerKey, Progress | None]],
    ) -> None:
        """A recovery that has not regained a step by its deadline has failed: escalate one tier.
        After an in-process recovery, the members that never reached the re-formed generation
        (stuck on the way) are restarted: stopped, the others re-form without them, and the
        plan grows the task back with new workers that take their state from the live ones.
        When that fails too, or nobody arrived, the task restarts from its newest intact
        checkpoint, and the nodes of the members that were stuck are isolated (SEV1). ``positions``:
        where each member's process last reported it was."""
        due = [i for (t, _), i in self.incidents.items() if t == name and i.deadline and now > i.deadline]
        if not due:
            return
        incident = due[0]
        incident.deadline = None
        waited = self.ctx.limits.recovery_deadline_s
        snapshot = self.ctx.store.snapshot()
        members = snapshot.live(name)
        stuck = not_arrived(members, positions(members), generation)
        if incident.actions[-1] == IN_PROCESS and 0 < len(stuck) < len(members):
            ranks = sorted(w.rank for w in stuck)
            self._escalate(
                name, incident, RESTART_FAILED, f"rank(s) {ranks} never reached generation {generation}"
            )
            spec = self.ctx.spec(name)
            stay = in_place(snapshot, name, set(ranks), incident.id, spec.is_usable, (), spec.replica_size)
            if self.generations.in_place(name) and not isinstance(stay, str):
                self._apply(stay, now)
                incident.stuck_nodes = {w.node for w in stuck}
                incident.deadline = now + waited
                return
        self._escalate(name, incident, RESTART_FROM_CHECKPOINT, f"no step within {waited:g} s")
        why = "a restart of its stuck workers did not recover the task"
        effects: list[Effect] = []
        for node in sorted(incident.stuck_nodes):  # tier two was carried out, and failed
            effects += isolation(snapshot, node, why, now, self.ctx.limits)
        task = snapshot.task(name)
        effects += [
            StopGeneration(name, task.generation, self.ctx.limits.failure_stop_grace_s),
            TaskDown(name, TaskState.RESTARTING),
        ]
        self._apply(effects, now)

    def _escalate(self, name: str, incident: Incident, to: str, why: str) -> None:
        task = self.ctx.store.get_task(name)
        self.ctx.act.record(
            "escalation",
            task=task.name,
            incident=incident.id,
            from_action=incident.actions[-1],
            to_action=to,
            why=why,
            generation=task.generation,
        )
        incident.action = to
        incident.actions.append(to)

    def rebuild(self) -> None:
        """After a restart: the incidents of live tasks that no outcome closed are open again
        (the next step regained closes them, a new fault supersedes them, and one recovering in
        place gets its deadline afresh: its members may have been stuck since before the
        restart); those of tasks that ended while no coordinator ran are closed with the task."""
        now = self.ctx.clock()
        for task in self.ctx.store.tasks():
            for generation, incident in reopened(self.ctx.store.events(task=task.name, limit=1_000_000)):
                if not task.state.live:
                    self._ended(task.name, incident, task.state)
                    continue
                if incident.actions[-1] in (IN_PROCESS, RESTART_FAILED):
                    incident.deadline = now + self.ctx.limits.recovery_deadline_s
                self.incidents[(task.name, generation)] = incident
                self.last_incident[task.name] = max(incident.id, self.last_incident.get(task.name, 0))

    def forget(self, name: str) -> None:
        """The task ended: nothing of it stays open; an incident still being recovered ends
        with it (its outcome says how the task ended)."""
        task = self.ctx.store.task(name)
        for key in [k for k in self.incidents if k[0] == name]:
            incident = self.incidents.pop(key)
            if task is not None:
                self._ended(name, incident, task.state)
        self._stop_awaiting(name)
        self.faults = {k: v for k, v in self.faults.items() if k[0] != name}
        self.recent.pop(name, None)
        self.last_incident.pop(name, None)
        self.task_faults = {k: v for k, v in self.task_faults.items() if k[0] != name}

    def _ended(self, name: str, incident: Incident, state: TaskState) -> None:
        self.ctx.act.record(
            "outcome",
            task=name,
            incident=incident.id,
            outcome=TASK_ENDED,
            task_state=state.value,
            action=incident.action,
            actions=incident.actions,
        )

    def root_cause(self, name: str, kind: ErrorKind, node: str) -> None:
        """A later, surer verdict for an open incident: the peers' connection errors that opened it
        were symptoms of this (a lost node), which is now recorded as its root cause."""
        for (task, _), incident in self.incidents.items():
            if task == name and incident.kind in CONSEQUENCES:
                self.ctx.act.record(
                    "root_cause",
                    task=name,
                    node=node,
                    incident=incident.id,
                    kind=kind.value,
                    first_seen_as=incident.kind.value,
                )
                incident.kind = kind

    def paused(self, seconds: float) -> None:
        """The coordinator did not run for ``seconds``: the recoveries' deadlines and the waits
        for a death's cause move on by as much (their time passed unwatched, not unused)."""
        for incident in self.incidents.values():
            if incident.deadline is not None:
                incident.deadline += seconds
        self.awaiting = {k: (since + seconds, kind, node) for k, (since, kind, node) in self.awaiting.items()}

    def expire_awaiting(self, now: float) -> None:
        """No death was reported in time: whoever is alive rebuilds the group in place. Peer
        errors of a generation the task has left (a grow or a restart moved it on) are dropped:
        answering them would re-form the new generation for nothing, and again at every tick,
        as nothing would ever clear them."""
        grace = self.ctx.limits.heartbeat_deadline_s + self.ctx.limits.cause_grace_s
        for (name, generation), (since, kind, where) in list(self.awaiting.items()):
            task = self.ctx.store.task(name)
            if task is None or task.generation != generation:
                self.awaiting.pop((name, generation), None)
                self.awaiting_ranks.pop((name, generation), None)
            elif now - since > grace:
                self.incident(name, kind, where, "peers reported errors; no rank died", set(), since)

    def _stop_awaiting(self, name: str) -> None:
        self.awaiting = {k: v for k, v in self.awaiting.items() if k[0] != name}
        self.awaiting_ranks = {k: v for k, v in self.awaiting_ranks.items() if k[0] != name}

    def node_lost(self, node: str, silent_s: float) -> None:
        store = self.ctx.store
        current = {t.name: t.generation for t in store.tasks(live_only=True)}
        gone: dict[str, set[int]] = {}
        for w in self.ctx.act.node_lost(node, silent_s):
            ranks = gone.setdefault(w.task, set())
            if current.get(w.task) == w.generation:
                ranks.add(w.rank)  # ranks of the task's current generation
        for name, ranks in gone.items():
            task = store.task(name)
            if task is not None and task.state.active and not ranks:
                self.generations.cancel_growth(name)  # only newcomers were there
            elif task is not None and task.state.active:
                why, last = f"node {node} silent for {silent_s:.1f} s", self.ctx.clock() - silent_s
                self.incident(name, ErrorKind.NODE_LOST, node, why, ranks, last, seen_as="last heartbeat")
            elif task is not None:
                self.root_cause(name, ErrorKind.NODE_LOST, node)

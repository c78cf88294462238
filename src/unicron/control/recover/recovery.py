"""Recovery: incidents, the recovery tier carried out for each, and the root cause.

The first sign of a failure in a generation opens its *incident*; later signs (the peers'
connection errors, the exits that follow) belong to it, and a failure of the same event (a
worker killed with the first, before the re-formed generation trained) widens it. The fault is
attributed to its scope first (``attribution.py``: a worker, its node, the task itself or the
checkpoint storage), so that only worker and node faults count against a node. The ladder
(``core/ladder.py``) asks for a tier; ``brain/response.py:respond`` carries out the cheapest one
that applies (``core/tiers.py``); a tier in place that regains no step by its deadline escalates.
What a failure decides is a value (``brain/deciding.py``); this module carries it out (the ladder's
counts, the records, the effects through the applier). The open incidents are kept as typed
records (``core/kept.py``) for a successor.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from unicron.brain.deciding import (
    Facts,
    FailureDecision,
    Incident,
    Opened,
    Seen,
    Widened,
    decide,
)
from unicron.brain.effects import Effect, Isolate, TaskDown
from unicron.brain.records import TaskRecord, WorkerRecord
from unicron.brain.response import (
    TASK_ENDED,
    Failure,
    Response,
    Stalled,
    escalate,
    regrouped,
)
from unicron.brain.snapshot import Snapshot
from unicron.control.context import Context
from unicron.control.detect.detection import Failing
from unicron.control.detect.hangs import WorkerKey, not_arrived
from unicron.control.detect.nodewatch import Silent
from unicron.control.recover.attribution import Attribution, Sign
from unicron.control.recover.generations import Generations
from unicron.core.kept import Isolations, OpenIncident, OpenIncidents
from unicron.core.ladder import Ladder
from unicron.core.protocol import IterationReport, Progress
from unicron.core.states import NodeState, TaskState
from unicron.core.taxonomy import TAXONOMY, ErrorKind, Scope
from unicron.core.tiers import Escalation, Tier

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


@dataclass
class Recovery:
    ctx: Context
    generations: Generations
    ladder: Ladder
    signs: Attribution  # whose fault each sign is
    incidents: dict[tuple[str, int], Incident] = field(default_factory=dict)  # the open one per generation
    faults: dict[tuple[str, int], float] = field(default_factory=dict)  # injection time per generation
    # (task, generation) -> (since, kind, node): a survivor saw a peer fail; the cause is due
    awaiting: dict[tuple[str, int], tuple[float, ErrorKind, str | None]] = field(default_factory=dict)
    awaiting_ranks: dict[tuple[str, int], set[int]] = field(default_factory=dict)
    isolated_until: dict[str, float | None] = field(default_factory=dict)  # None: until resumed
    last_incident: dict[str, int] = field(default_factory=dict)  # per task, open or closed

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
        killed: bool = False,
        detail: Mapping[str, Any] | None = None,
    ) -> None:
        """Open the generation's incident (once) and carry out the ladder's decision. ``detail``:
        recorded with the incident (a worker's output when it ended before its first step). ``failed``:
        the ranks known to be gone (without them the survivors cannot be told apart);
        ``seen_at``: when the symptom happened (``seen_as`` says what that time is), for the
        detection time when no fault was injected; ``generation``: the one the failing worker
        was in, if known (for ``attribute``); ``killed``: the worker was killed from outside
        (SIGKILL or SIGTERM not ordered by us: the OOM killer, an operator), no doing of its
        program's."""
        now = self.ctx.clock()
        task = self.ctx.store.get_task(name)
        fresh = task.state is TaskState.STARTING and task.launched_generation == task.generation
        if scope is None and fresh and not killed:
            # A freshly launched generation failing before its first step: the program, its
            # data or its configuration, not the machine (hardware kinds keep their node scope).
            scope = Scope.TASK if TAXONOMY[kind].scope is Scope.WORKER else None
        scope = self.signs.note(name, Sign(now, kind, node, generation), scope)
        failure = Failure(name, node, why, None if failed is None else frozenset(failed))
        seen = Seen(failure, kind, scope, generation)
        decided = self.decide(task, seen, now)
        if isinstance(decided, Widened):
            self._widen(decided, task, seen, now)
        elif isinstance(decided, Opened):
            self._stop_awaiting(name)  # this incident answers every peer error of the task so far
            self.generations.cancel_growth(name)
            self.ladder.count(decided.asked.counted)
            self.ladder.carried(name, decided.response.tier, now)
            self.ctx.act.keep_ladder(self.ladder)
            incident = self._open(task, seen, decided, seen_at, seen_as, detail)
            for step in decided.response.escalations:  # the tiers asked for that could not apply, and why
                self._record_escalation(task, incident, step, carried=False)
            self._carry_out(task, incident, decided.response, now, began=self._began(task, seen_at))

    def decide(self, task: TaskRecord, seen: Seen, now: float) -> FailureDecision:
        """What ``seen`` decides (``deciding.decide``: nothing is changed), from the task's open
        incidents, the ladder's counts and a snapshot of the cluster."""
        spec = self.ctx.spec(task.name)
        facts = Facts(
            spec.run.recovery == "in_process",
            self.generations.growth(task.name) is not None,
            spec.is_usable,
            spec.replica_size,
        )
        incidents = [i for (name, _), i in self.incidents.items() if name == task.name]
        read = functools.partial(self._snapshot, task.name)
        return decide(task, seen, incidents, self.ladder, read, facts, self.ctx.limits, now)

    def _began(self, task: TaskRecord, seen_at: float | None) -> float | None:
        """When a failure of the task's current generation began: its injection, if the fault
        library reported one, else its first sign (None: not known; it began when detected)."""
        injected = self.faults.get((task.name, task.generation))
        return seen_at if injected is None else injected

    def _widen(self, widened: Widened, task: TaskRecord, seen: Seen, now: float) -> None:
        """More of the same event: the incident's tier is carried out again on the generation it
        formed, without the newly failed ranks (escalating while it cannot apply); the ladder
        counts nothing more (one event is one incident)."""
        incident, response, failure = widened.incident, widened.response, seen.failure
        self.ctx.act.record(
            "incident_widened",
            task=task.name,
            node=failure.node,
            incident=incident.id,
            generation=task.generation,
            kind=seen.kind.value,
            failed=None if failure.failed is None else sorted(failure.failed),
            why=failure.why,
        )
        for i, step in enumerate(response.escalations):
            self._record_escalation(task, incident, step, carried=i == len(response.escalations) - 1)
        if response.escalations:
            self.ladder.carried(task.name, response.tier, now)
            self.ctx.act.keep_ladder(self.ladder)
        self._carry_out(task, incident, response, now)

    def _carry_out(
        self, task: TaskRecord, incident: Incident, response: Response, now: float, began: float | None = None
    ) -> None:
        """Apply the tier's effects and record what they did: the generation re-formed in place,
        the response (when it was decided), and a failed task's outcome. ``began``: when the
        failure began, which the task's downtime counts from."""
        name = task.name
        if response.tier.in_place:
            incident.deadline = now + self.ctx.limits.recovery_deadline_s
        effects = tuple(replace(e, began=began) if isinstance(e, TaskDown) else e for e in response.effects)
        self._apply(effects, now)
        incident.formed = None
        if response.tier.in_place:
            detail = regrouped(response.effects)
            incident.formed = detail.get("generation")
            tier = response.tier.label
            self.ctx.act.record("in_process_recovery", task=name, incident=incident.id, tier=tier, **detail)
        decided = self.ctx.clock()
        self.ctx.act.record(
            "response",
            task=name,
            incident=incident.id,
            action=response.tier.label,
            decided_at=decided,
            decision_s=round(decided - now, 6),
        )
        if response.tier is Tier.FAIL_TASK:
            why = self.ctx.store.get_task(name).reason or ""
            self.ctx.act.record("outcome", task=name, incident=incident.id, outcome="task failed", why=why)
            del self.incidents[(name, incident.generation)]  # the rest once the coordinator frees it
        if not response.tier.in_place:
            self._stop_awaiting(name)  # the relaunch answers every peer error of the generation
        self._keep_incidents(name)

    def _snapshot(self, name: str) -> Snapshot:
        """What a decision about ``name`` reads: its task, every node, the isolations running."""
        return self.ctx.store.snapshot(only=name).with_isolations(dict(self.isolated_until))

    def _apply(self, effects: Sequence[Effect], now: float) -> None:
        self.ctx.act.apply(effects, now)
        isolated = {e.node: e.until for e in effects if isinstance(e, Isolate)}
        if isolated:
            self.isolated_until |= isolated
            self.ctx.act.keep(Isolations(until=self.isolated_until))

    def _open(
        self,
        task: TaskRecord,
        seen: Seen,
        opened: Opened,
        seen_at: float | None,
        seen_as: str,
        detail: Mapping[str, Any] | None = None,
    ) -> Incident:
        """Record the generation's incident (the tier carried out, the one the ladder asked for
        and why, when the fault began) and close the ones it supersedes (a new fault struck
        while they were being recovered)."""
        now, name, record = self.ctx.clock(), task.name, self.ctx.act.record
        kind, node, decision, tier = seen.kind, seen.failure.node, opened.asked, opened.response.tier
        superseded = [k for k in self.incidents if k[0] == name]
        injected = self.faults.get((name, task.generation))
        began = self._began(task, seen_at)
        incident_id = record(
            "incident",
            task=name,
            node=node,
            kind=kind.value,
            severity=decision.severity.name,
            action=tier.label,
            asked=decision.tier.label,
            scope=seen.scope.value,
            why=seen.failure.why,
            ladder=decision.why,
            detected_at=now,
            detection_s=None if began is None else round(max(0.0, now - began), 4),
            fault_at=began,
            fault_source="injected" if injected is not None else None if began is None else seen_as,
            generation=task.generation,
            step=task.step,
            checkpoint_step=task.checkpoint_step,
            **(detail or {}),
        )
        for key in superseded:
            earlier = self.incidents.pop(key)
            record("outcome", task=name, incident=earlier.id, outcome="superseded", by=incident_id)
        incident = Incident(incident_id, kind, now, [tier], task.generation)
        self.incidents[(name, task.generation)] = incident
        self.last_incident[name] = incident_id
        return incident

    def recovered(self, name: str, downtime: float, first: IterationReport) -> None:
        """The task completed ``first``, its first step since it stopped: its incidents are
        recovered (the step's end regained training; the transition ended when its computing
        resumed: the step's start after a relaunch, the group re-formed within it in place)."""
        closed = False
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
                    action=incident.tier.label,
                    actions=incident.labels(),
                )
                del self.incidents[(task, generation)]
                closed = True
        if closed:
            self._keep_incidents(name)

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
        """A recovery in place that has not regained a step by its deadline has failed: it
        escalates one tier (and further while a tier cannot apply, each time saying why), acting
        on the members that never reached the re-formed generation (``response.escalate``;
        ``positions``: where each member's process last reported it was)."""
        due = [i for (t, _), i in self.incidents.items() if t == name and i.deadline and now > i.deadline]
        if not due:
            return
        incident = due[0]
        incident.deadline = None
        snapshot = self._snapshot(name)
        members = snapshot.live(name)
        stuck = tuple(not_arrived(members, positions(members), generation))
        if stuck:  # where they are held, for the user: dumped before the stops that follow
            self.ctx.act.dump_stacks(name, generation)
        stalled = Stalled(name, incident.tier, generation, members, stuck, frozenset(incident.stuck_nodes))
        spec = self.ctx.spec(name)
        may_stay = self.generations.in_place(name)
        response = escalate(
            snapshot, stalled, may_stay, spec.is_usable, self.ctx.limits, now, spec.replica_size
        )
        task = snapshot.task(name)
        for i, step in enumerate(response.escalations):
            self._record_escalation(task, incident, step, carried=i == len(response.escalations) - 1)
        self.ladder.carried(name, response.tier, now)
        self.ctx.act.keep_ladder(self.ladder)
        if response.tier.in_place:
            incident.stuck_nodes |= {w.node for w in stuck}
        self._carry_out(task, incident, response, now)

    def _record_escalation(
        self, task: TaskRecord, incident: Incident, step: Escalation, carried: bool
    ) -> None:
        """Record one step up the tiers: ``carried``, its tier is now under way; else it only
        passed that tier (it could not apply), on the way to the one carried out."""
        self.ctx.act.record(
            "escalation",
            task=task.name,
            incident=incident.id,
            from_action=step.from_tier.label,
            to_action=step.to_tier.label,
            why=step.why,
            generation=task.generation,
            carried=carried,
        )
        if carried:
            incident.tiers.append(step.to_tier)

    def rebuild(self) -> None:
        """After a restart: the incidents kept open are open again (the next step regained
        closes them, a new fault supersedes them, and one recovering in place gets its deadline
        afresh: its members may have been stuck since before the restart); those of tasks that
        ended while no coordinator ran are closed with the task."""
        now = self.ctx.clock()
        for task in self.ctx.store.tasks():
            kept = self.ctx.store.kept_record(OpenIncidents, of=task.name)
            for row in [] if kept is None else kept.incidents:
                tiers = list(row.tiers)
                incident = Incident(row.id, row.kind, row.detected, tiers, row.generation, row.formed)
                incident.stuck_nodes = set(row.stuck_nodes)
                if not task.state.live:
                    self._ended(row.task, incident, task.state)
                    continue
                if incident.tier.in_place:
                    incident.deadline = now + self.ctx.limits.recovery_deadline_s
                self.incidents[(row.task, row.generation)] = incident
                self.last_incident[row.task] = max(incident.id, self.last_incident.get(row.task, 0))
            if kept is not None:
                self._keep_incidents(task.name)

    def _keep_incidents(self, name: str) -> None:
        """Keep the task's open incidents, as they now are, for a successor: one record per task,
        so that an incident's change writes its task's alone (a burst of failures across 100
        tasks rewrote every open incident at each one)."""
        rows = [
            OpenIncident(
                id=i.id,
                task=task,
                kind=i.kind,
                detected=i.detected,
                tiers=i.tiers,
                generation=i.generation,
                formed=i.formed,
                stuck_nodes=sorted(i.stuck_nodes),
            )
            for (task, _), i in sorted(self.incidents.items(), key=lambda kv: kv[1].id)
            if task == name
        ]
        if rows:
            self.ctx.act.keep(OpenIncidents(incidents=rows), of=name)
        else:
            self.ctx.act.drop_kept(OpenIncidents, of=name)

    def forget(self, name: str) -> None:
        """The task ended: nothing of it stays open; an incident still being recovered ends
        with it (its outcome says how the task ended)."""
        task = self.ctx.store.task(name)
        for key in [k for k in self.incidents if k[0] == name]:
            incident = self.incidents.pop(key)
            if task is not None:
                self._ended(name, incident, task.state)
        self._keep_incidents(name)
        self._stop_awaiting(name)
        self.faults = {k: v for k, v in self.faults.items() if k[0] != name}
        self.signs.forget(name)
        self.last_incident.pop(name, None)

    def _ended(self, name: str, incident: Incident, state: TaskState) -> None:
        self.ctx.act.record(
            "outcome",
            task=name,
            incident=incident.id,
            outcome=TASK_ENDED,
            task_state=state.value,
            action=incident.tier.label,
            actions=incident.labels(),
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
                self._keep_incidents(name)

    # ------------------------------------------------------------ what detection reads (Handled)
    def has_incident(self, key: tuple[str, int]) -> bool:
        return key in self.incidents

    def awaiting_cause(self, key: tuple[str, int]) -> bool:
        return key in self.awaiting

    def open_count(self) -> int:
        return len(self.incidents)

    def injected(self, key: tuple[str, int], at: float) -> None:
        """The fault library injected a fault in the generation at ``at``: its failure began then."""
        self.faults[key] = at

    def isolated_until_of(self, node: str) -> float | None:
        """When the node's isolation ends (0: it is not isolated; None: when an operator resumes it)."""
        return self.isolated_until.get(node, 0.0)

    def released(self, node: str) -> None:
        """An operator put the node back in service: its isolation is over."""
        if self.isolated_until.pop(node, 0.0) != 0.0:
            self.ctx.act.keep(Isolations(until=self.isolated_until))

    def restore_isolations(self, kept: Isolations, isolated: Sequence[str]) -> None:
        """The predecessor's isolations; a node isolated with no end kept (a crash between the
        writes) is over."""
        self.isolated_until = dict(kept.until)
        for name in isolated:
            self.isolated_until.setdefault(name, 0.0)

    def open_incident(self, key: tuple[str, int]) -> int | None:
        """The id of the generation's open incident, if any."""
        incident = self.incidents.get(key)
        return None if incident is None else incident.id

    def failing(self, found: Failing) -> None:
        """Open the incident for a failure detection found (``detect/detection.py:Failing``)."""
        failed = None if found.failed is None else set(found.failed)
        self.incident(found.task, found.kind, found.node, found.why, failed, found.seen_at, found.scope)

    def isolations_over(self, now: float) -> bool:
        """Nodes whose isolation ran out are back in service; True when any was. (Looked up by
        the isolations' ends, not by reading every node: this runs on every tick.)"""
        over = False
        for name in [n for n, until in self.isolated_until.items() if until is not None and now >= until]:
            node = self.ctx.store.node(name)
            if node is not None and node.state is NodeState.ISOLATED:
                self.ctx.act.node_state(node.name, NodeState.HEALTHY)
                self.ctx.act.record("node_back", node=node.name, why="isolation over")
                over = True
        return over

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
        grace = self.ctx.pace.judged(now).deadline_s + self.ctx.limits.cause_grace_s
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

    def node_lost(self, silent: Silent) -> None:
        store, node, silent_s = self.ctx.store, silent.node, silent.silent_s
        current = {t.name: t.generation for t in store.tasks(live_only=True)}
        gone: dict[str, set[int]] = {}
        for w in self.ctx.act.node_lost(node, silent_s, silent.late_s, silent.deadline_s):
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

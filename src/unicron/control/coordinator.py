"""The coordinator's logic: nodes, tasks, generations, placement, detection and handling.

All methods are synchronous and run on the service's event loop, one at a time, so they never
race. The HTTP layer (``control.service``) only translates requests into these calls.

Detection (docs/detection.md): node heartbeats with a deadline, worker exits seen by agents,
exceptions forwarded by the training library, and hangs and stragglers from iteration
statistics (``monitor.py``). Each failure becomes one *incident* per task generation, handled at
the level the severity ladder picks (``handling.py``) and recorded with its detection time,
kind, severity, action and outcome. Recovery is in place when the failed ranks are known (the
survivors rebuild their group), else a restart from the checkpoint; a hung worker is killed
first, so that it becomes an ordinary death.

Placement (docs/live-cluster.md): on node loss, node return, task arrival and completion the
planner's answer (looked up in a precomputed table where it can be: ``allocator.py``) is carried
out in place: tasks shrink at a step boundary, grow with newcomers that take their state from
live replicas, and measured throughput (``rates.py``) replaces the planner's estimates.
"""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from unicron.control.allocator import Allocator, Decided
from unicron.control.handling import Ladder
from unicron.control.monitor import TaskMonitor
from unicron.control.rates import RateMeter
from unicron.control.rendezvous import Rendezvous
from unicron.control.spares import choose, spare_gains
from unicron.control.store import LIVE_TASK_STATES, Store
from unicron.core.errors import SpecError, SpecProblem, UsageError
from unicron.core.gpus import custom_gpu
from unicron.core.protocol import (
    SPARE_GENERATION,
    CheckpointReport,
    DoneReport,
    ExceptionReport,
    ExitReport,
    FaultReport,
    Heartbeat,
    HeartbeatReply,
    IterationReport,
    LaunchWorker,
    Membership,
    Order,
    Registration,
    RegistrationReply,
    RenameWorker,
    StopWorkers,
    WorkerReport,
    WorkerState,
    membership_key,
    ready_key,
    spare_key,
)
from unicron.core.settings import Settings
from unicron.core.specs import LiveTaskSpec, PlannerSettings
from unicron.core.taxonomy import ErrorKind
from unicron.planning.placement import Assignment
from unicron.planning.planner import ClusterState
from unicron.planning.throughput import ThroughputCurve, curve_for


@dataclass(frozen=True)
class CoordinatorSettings:
    state_dir: Path
    checkpoint_root: Path
    advertise_host: str = "127.0.0.1"  # where workers reach the rendezvous stores
    node_mtbf_hours: float = 1000.0  # for the planner's expected run time
    limits: Settings = field(default_factory=Settings)


@dataclass
class _Pending:
    orders: dict[str, list[Order]] = field(default_factory=dict)
    on_add: Callable[[str], None] | None = None  # wakes the node's waiting long poll

    def add(self, node: str, order: Order) -> None:
        queue = self.orders.setdefault(node, [])
        if isinstance(order, StopWorkers) and order in queue:
            return
        queue.append(order)
        if self.on_add is not None:
            self.on_add(node)

    def take(self, node: str) -> list[Order]:
        return self.orders.pop(node, [])


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
class _Incident:
    id: int
    kind: ErrorKind
    detected: float
    action: str


@dataclass
class _Spare:
    task: str
    rank: int  # its identity at the agent: (task, SPARE_GENERATION, rank)
    node: str
    local_rank: int
    since: float
    used: float | None = None  # when a grow took it (it keeps its entry until renamed)


@dataclass
class _Growth:
    generation: int  # the generation newcomers joined
    membership: Membership
    newcomers: list[int]  # their ranks in that generation
    since: float


class Coordinator:
    def __init__(self, settings: CoordinatorSettings) -> None:
        self.settings = settings
        self.limits = settings.limits
        self.store = Store(settings.state_dir / "unicron.sqlite")
        self.rendezvous = Rendezvous(settings.advertise_host)
        self.pending = _Pending()
        self.ladder = Ladder(self.limits)
        self.monitors: dict[tuple[str, int], TaskMonitor] = {}
        self.stopped: dict[tuple[str, int, int], bool] = {}  # worker -> process is stopped (SIGSTOP)
        self.faults: dict[tuple[str, int], float] = {}  # (task, generation) -> injection time
        self.incidents: dict[tuple[str, int], _Incident] = {}  # the open incident of a generation
        self.isolated_until: dict[str, float] = {}
        self._specs: dict[str, LiveTaskSpec] = {}
        # (task, generation) -> (since, kind, node): a survivor saw a peer fail; the cause is due
        self.awaiting: dict[tuple[str, int], tuple[float, ErrorKind, str | None]] = {}
        self.awaiting_ranks: dict[tuple[str, int], set[int]] = {}
        self.growing: dict[str, _Growth] = {}  # task -> newcomers launched, not yet joined
        # (task, generation, rank) -> deadline: workers a planned shrink let go, exiting by themselves
        self.leaving: dict[tuple[str, int, int], float] = {}
        self.spares: dict[tuple[str, int], _Spare] = {}
        self.allocator = Allocator()
        self.rates = RateMeter(window_s=self.limits.measure_window_s, change=self.limits.measure_change)
        self._last_plan: dict[str, int] | None = None
        self.dirty = True
        # Silence is counted from when the service can hear heartbeats at all: after a restart
        # every known node gets a full deadline to reconnect (its workers kept training).
        self.listening_since: float | None = None
        for task in self.store.tasks(live_only=True):
            if task.store_port:
                port = self.rendezvous.host(task.name, task.store_port)
                if port != task.store_port:
                    self.store.update("tasks", {"name": task.name}, store_port=port)
        # Newcomers of a grow that was in flight when the coordinator stopped cannot join any
        # more (the plan to let them in was in memory): stop them; the planner may grow again.
        for task in self.store.tasks(live_only=True):
            for w in self.store.query(
                "SELECT * FROM workers WHERE task = ? AND generation > ? AND state = 'launching'",
                task.name,
                task.generation,
            ):
                self.pending.add(
                    w.node, StopWorkers(task=w.task, generation=w.generation, rank=w.rank, grace_s=0.0)
                )
                self.store.update(
                    "workers", {"task": w.task, "generation": w.generation, "rank": w.rank}, state="stopped"
                )
        self.store.event("coordinator_started", tasks=len(self.store.tasks(live_only=True)))

    # ------------------------------------------------------------------ user API
    def submit(self, spec: LiveTaskSpec) -> None:
        if self.store.task(spec.name) is not None:
            raise SpecError(
                "request", [SpecProblem("name", f"a task named {spec.name!r} exists", "choose another name")]
            )
        with self.store.transaction() as db:
            db.execute(
                "INSERT INTO tasks (name, spec, state, submitted) VALUES (?, ?, 'waiting', ?)",
                (spec.name, spec.model_dump_json(), time.time()),
            )
        self.store.event("task_submitted", task=spec.name, weight=spec.weight)
        self.dirty = True

    def cancel(self, name: str) -> None:
        task = self.store.task(name)
        if task is None:
            raise UsageError(f"no task named {name!r}")
        if task.state not in LIVE_TASK_STATES:
            raise UsageError(f"task {name!r} is already {task.state}")
        self._stop_generation(name, task.generation, self.limits.stop_grace_s)
        self.store.update("tasks", {"name": name}, state="cancelled", finished=time.time())
        self.store.event("task_cancelled", task=name)
        self.rendezvous.close(name)
        self.dirty = True

    def spec(self, name: str) -> LiveTaskSpec:
        """A task's spec; specs never change, so each is parsed once (reports are a hot path)."""
        if name not in self._specs:
            task = self.store.task(name)
            assert task is not None
            self._specs[name] = LiveTaskSpec.model_validate_json(task.spec)
        return self._specs[name]

    # ------------------------------------------------------------------ agents
    def register(self, reg: Registration) -> RegistrationReply:
        now = time.time()
        known = self.store.node(reg.node)
        others = [n for n in self.store.nodes() if n.name != reg.node]
        if others and any(n.slots != reg.slots for n in others):
            raise UsageError(
                f"node {reg.node} offers {reg.slots} slots but the cluster's nodes have "
                f"{others[0].slots}; start every agent with the same --slots"
            )
        # An isolated node stays out until its isolation ends, even if its agent comes back.
        state = "isolated" if known is not None and known.state == "isolated" else "healthy"
        with self.store.transaction() as db:
            if known is None:
                db.execute(
                    "INSERT INTO nodes (name, slots, gpus, host, state, last_seen) VALUES (?, ?, ?, ?, ?, ?)",
                    (reg.node, reg.slots, json.dumps(reg.gpus), reg.host, state, now),
                )
            else:
                db.execute(
                    "UPDATE nodes SET slots = ?, gpus = ?, host = ?, state = ?, last_seen = ? WHERE name = ?",
                    (reg.slots, json.dumps(reg.gpus), reg.host, state, now, reg.node),
                )
        if known is None or known.state == "lost":
            self.store.event("node_joined" if known is None else "node_back", node=reg.node, slots=reg.slots)
            self.dirty = True
        self._reconcile_workers(reg.node, reg.workers)
        return RegistrationReply(
            node=reg.node,
            heartbeat_interval_s=self.limits.heartbeat_interval_s,
            heartbeat_deadline_s=self.limits.heartbeat_deadline_s,
        )

    def heartbeat(self, hb: Heartbeat) -> HeartbeatReply:
        node = self.store.node(hb.node)
        if node is None or node.state == "lost":
            # Unknown, or declared lost: it must register again (and its stale workers stop).
            return HeartbeatReply(registered=False)
        self.store.update("nodes", {"name": hb.node}, last_seen=time.time())
        for report in hb.reports:
            self.handle_report(report, hb.node)
        self._reconcile_workers(hb.node, hb.workers)
        return HeartbeatReply(orders=self.pending.take(hb.node))

    def orders(self, node: str) -> list[Order]:
        """Orders waiting for a node (the agents' long poll)."""
        return self.pending.take(node)

    def _moved(self, w: WorkerState) -> bool:
        row = self.store.one(
            "SELECT state FROM workers WHERE task = ? AND generation = ? AND rank = ?",
            w.task,
            w.generation,
            w.rank,
        )
        return row is not None and row.state == "moved"

    def _reconcile_workers(self, node: str, reported: list[WorkerState]) -> None:
        """Track worker processes; stop those that belong to no live generation."""
        for w in reported:
            self.stopped[(w.task, w.generation, w.rank)] = w.stopped and w.running
            if w.generation == SPARE_GENERATION and (w.task, w.rank) in self.spares:
                continue  # a hot spare waiting to be used (or being renamed into its new identity)
            task = self.store.task(w.task)
            current = task is not None and task.state in LIVE_TASK_STATES and task.generation == w.generation
            leaving = self.leaving.get((w.task, w.generation, w.rank))
            if not current and w.running and self._moved(w) and (leaving is None or time.time() < leaving):
                continue  # renamed into the new generation (the agent will catch up), or leaving
            growth = self.growing.get(w.task)
            if growth is not None and w.generation == growth.generation:
                current = True  # a newcomer waiting to join its live peers
            if not current and w.running:
                # Exactly that worker: a generation-wide stop could hit a survivor mid-rename.
                self.pending.add(
                    node,
                    StopWorkers(
                        task=w.task, generation=w.generation, rank=w.rank, grace_s=self.limits.stop_grace_s
                    ),
                )
            elif current and w.running:
                key = {"task": w.task, "generation": w.generation, "rank": w.rank}
                row = self.store.one(
                    "SELECT state FROM workers WHERE task = ? AND generation = ? AND rank = ?", *key.values()
                )
                if row is not None and row.state == "launching":
                    self.store.update("workers", key, state="running", pid=w.pid)

    # ------------------------------------------------------------------ reports
    def handle_report(self, report: WorkerReport, node: str) -> None:
        if isinstance(report, ExitReport) and report.generation == SPARE_GENERATION:
            self._drop_spare((report.task, report.rank), stop=False)
            return
        task = self.store.task(report.task)
        if task is None or report.generation != task.generation:
            return  # stale: from a generation that is gone
        if isinstance(report, IterationReport):
            self._iteration(task, report)
        elif isinstance(report, FaultReport):
            self.faults[(report.task, report.generation)] = report.time
            self.store.event(
                "fault_injected",
                task=report.task,
                node=node,
                rank=report.rank,
                step=report.step,
                action=report.action,
                generation=report.generation,
            )
        elif isinstance(report, ExceptionReport):
            self.store.event(
                "exception",
                task=report.task,
                node=node,
                rank=report.rank,
                step=report.step,
                kind=report.kind,
                error=f"{report.error_type}: {report.message}"[:500],
            )
            kind = ErrorKind(report.kind)
            if task.state in ("starting", "running"):
                if kind in CONSEQUENCES and self.spec(task.name).run.recovery == "in_process":
                    # A survivor's view of a peer's failure: wait (briefly) for the cause, which
                    # names the failed rank, so that the survivors can go on without it.
                    key = (task.name, task.generation)
                    self.awaiting.setdefault(key, (time.time(), kind, node))
                    reporting = self.awaiting_ranks.setdefault(key, set())
                    reporting.add(report.rank)
                    if len(reporting) >= len(self.store.workers(task.name, task.generation, live=True)):
                        # Every member is alive and waiting: a broken connection, not a death.
                        # Reattempt in place: the same members rebuild their group.
                        self._incident(
                            task.name, kind, node, "every rank lost its connections; all alive", failed=set()
                        )
                else:
                    self._incident(
                        task.name,
                        kind,
                        node,
                        f"rank {report.rank} raised {report.error_type}",
                        failed={report.rank},
                    )
        elif isinstance(report, CheckpointReport):
            if report.rank == 0:
                self.store.update("tasks", {"name": report.task}, checkpoint_step=report.step)
        elif isinstance(report, DoneReport):
            if report.rank == 0:
                self.store.update(
                    "tasks", {"name": report.task}, digest=report.digest, step=max(task.step, report.step)
                )
        elif isinstance(report, ExitReport):
            self._exit(task, report)

    def _monitor(self, name: str, generation: int) -> TaskMonitor:
        key = (name, generation)
        if key not in self.monitors:
            previous = next((m for (t, _), m in self.monitors.items() if t == name), None)
            self.monitors = {k: v for k, v in self.monitors.items() if k[0] != name}
            monitor = TaskMonitor(self.limits, self.spec(name).run.checkpoint_every)
            if previous is not None:
                # A membership change does not change how long a step takes: keep the history,
                # so that a hang right after the change is caught too.
                monitor.intervals = deque(previous.intervals)
                monitor.last_step, monitor.last_time = previous.last_step, previous.last_time
            self.monitors[key] = monitor
        return self.monitors[key]

    def _iteration(self, task: Any, report: IterationReport) -> None:
        spec = self.spec(task.name)
        monitor = self._monitor(task.name, task.generation)
        for rank, slow in monitor.rank_compute(report.step, report.rank, report.compute_s, task.workers):
            self.store.event(
                "straggler" if slow else "straggler_recovered",
                task=task.name,
                rank=rank,
                step=report.step,
                generation=task.generation,
            )
        values: dict[str, Any] = {"samples": task.samples + report.samples}
        if spec.run.flops_per_sample:
            values["flop"] = task.flop + spec.weight * spec.run.flops_per_sample * report.samples
            rate = self.rates.report(
                task.name,
                task.generation,
                task.workers,
                report.step,
                report.rank,
                report.samples,
                report.time or time.time(),
                spec.run.flops_per_sample,
            )
            if rate is not None:
                self.store.event("throughput_measured", task=task.name, workers=task.workers, flops=rate)
                self.dirty = True  # the plan may change with it
        if report.rank == 0:
            monitor.step_done(report.step, report.time or time.time())
            values["step"] = max(task.step, report.step)
            if task.state == "starting":
                values["state"] = "running"
                self.dirty = True  # the plan may want it larger or smaller now
                if task.down_since is not None:
                    downtime = time.time() - task.down_since
                    values["downtime_s"] = task.downtime_s + downtime
                    values["down_since"] = None
                    self._recovered(task.name, downtime, report.step)
                self.store.event(
                    "task_running",
                    task=task.name,
                    generation=task.generation,
                    workers=task.workers,
                    step=report.step,
                )
        self.store.update("tasks", {"name": task.name}, **values)

    def _exit(self, task: Any, report: ExitReport) -> None:
        key = {"task": report.task, "generation": report.generation, "rank": report.rank}
        ok = report.code == 0
        self.store.update(
            "workers",
            key,
            state="exited" if ok else "failed",
            exit_code=report.code,
            exit_signal=report.signal,
        )
        iterations = self.spec(task.name).run.iterations
        if not ok and task.state in ("starting", "running"):
            how = f"signal {report.signal}" if report.signal else f"code {report.code}"
            self._incident(
                task.name,
                ErrorKind.EXITED_ABNORMALLY,
                report.node,
                f"rank {report.rank} on {report.node} exited with {how}",
                failed={report.rank},
            )
        elif ok and task.state == "running" and task.step < iterations:
            # A clean exit before the end (stopped from outside): its peers cannot go on.
            self._incident(
                task.name,
                ErrorKind.EXITED_ABNORMALLY,
                report.node,
                f"rank {report.rank} on {report.node} exited before the last step",
                failed={report.rank},
            )
        elif ok:
            live = self.store.workers(report.task, report.generation, live=True)
            # Finished: every worker of the generation exited cleanly after the last step (a
            # generation that resumed from the final checkpoint finishes without iterating).
            if not live and task.state in ("starting", "running") and task.step >= iterations:
                self.store.update("tasks", {"name": task.name}, state="finished", finished=time.time())
                self.store.event("task_finished", task=task.name, step=task.step, digest=task.digest)
                self.rendezvous.close(task.name)
                self.dirty = True

    # ------------------------------------------------------------------ incidents
    def _incident(
        self, name: str, kind: ErrorKind, node: str | None, why: str, failed: set[int] | None = None
    ) -> None:
        """The first sign of a failure in a generation opens its incident; later signs (the
        peers' connection errors, the exits that follow) belong to it. ``failed``: the ranks
        known to be gone; without them the survivors cannot be told apart."""
        task = self.store.task(name)
        assert task is not None
        if (name, task.generation) in self.incidents:
            return
        self.awaiting.pop((name, task.generation), None)
        self.awaiting_ranks.pop((name, task.generation), None)
        self._cancel_growth(name)
        now = time.time()
        decision = self.ladder.decide(name, kind, node, now)
        injected = self.faults.get((name, task.generation))
        self.store.event(
            "incident",
            task=name,
            node=node,
            kind=kind.value,
            severity=decision.severity.name,
            action=decision.action.label,
            why=why,
            ladder=decision.why,
            detected_at=now,
            detection_s=None if injected is None else round(now - injected, 4),
            generation=task.generation,
            step=task.step,
            checkpoint_step=task.checkpoint_step,
        )
        incident_id = self.store.one("SELECT MAX(id) AS id FROM events").id  # type: ignore[union-attr]
        self.incidents[(name, task.generation)] = _Incident(incident_id, kind, now, decision.action.label)
        if decision.isolate_node and node is not None:
            self._isolate(node, f"{kind.value} ({decision.why})")
        if (
            not decision.fail_task
            and failed is not None
            and self._shrink_in_process(name, failed, incident_id)
        ):
            return
        self._stop_generation(name, task.generation, self.limits.failure_stop_grace_s)
        if decision.fail_task:
            self.store.update(
                "tasks", {"name": name}, state="failed", finished=now, failures=task.failures + 1
            )
            self.store.event(
                "outcome", task=name, incident=incident_id, outcome="task failed", why=decision.why
            )
            self.rendezvous.close(name)
        else:
            self.store.update(
                "tasks",
                {"name": name},
                state="restarting",
                failures=task.failures + 1,
                down_since=task.down_since or now,
            )
        self.dirty = True

    # ------------------------------------------------------------------ in-process membership changes
    def _shrink_in_process(self, name: str, failed: set[int], incident_id: int) -> bool:
        """The survivors rebuild their group as the next generation and go on; nothing restarts.
        False when that is not possible (the task asked for restarts, or too few survivors)."""
        task = self.store.task(name)
        assert task is not None
        spec = self.spec(name)
        if spec.run.recovery != "in_process" or name in self.growing:
            return False
        healthy = {n.name for n in self.store.nodes() if n.state == "healthy"}
        live = self.store.workers(name, task.generation, live=True)
        survivors = [w for w in live if w.rank not in failed and w.node in healthy]
        keep = max((k for k in range(len(survivors), 0, -1) if spec.is_usable(k)), default=0)
        if keep == 0:
            self.store.event(
                "in_process_impossible",
                task=name,
                incident=incident_id,
                why=f"{len(survivors)} survivor(s), no usable size",
                live=[(w.rank, w.node, w.state) for w in live],
                failed=sorted(failed),
            )
            return False
        kept = survivors[:keep]
        new = Membership(
            generation=self._next_generation(name),
            world_size=keep,
            ranks={w.rank: i for i, w in enumerate(kept)},
            failed=sorted(failed | {w.rank for w in live if w.node not in healthy}),
        )
        now = time.time()
        for w in live:
            if w.rank in failed and w.node in healthy:
                # Make sure the failed rank is gone (a raising or hung process may linger).
                self.pending.add(
                    w.node, StopWorkers(task=name, generation=task.generation, rank=w.rank, grace_s=0.0)
                )
        self._switch(name, task.generation, new, kept, now)
        self.store.update(
            "tasks",
            {"name": name},
            state="starting",
            failures=task.failures + 1,
            down_since=task.down_since or now,
        )
        self.store.event(
            "in_process_recovery",
            task=name,
            incident=incident_id,
            generation=new.generation,
            workers=keep,
            failed=sorted(failed),
            survivors=[w.rank for w in survivors],
        )
        self.dirty = True
        return True

    def _switch(self, name: str, generation: int, new: Membership, kept: list[Any], now: float) -> None:
        """Record the new generation's surviving members and tell them (store, agents)."""
        with self.store.transaction() as db:
            db.execute(
                "UPDATE workers SET state = CASE WHEN state IN ('launching', 'running') THEN 'moved' "
                "ELSE state END WHERE task = ? AND generation = ?",
                (name, generation),
            )
            for w in kept:
                db.execute(
                    "INSERT OR REPLACE INTO workers (task, generation, rank, node, local_rank, state, pid, "
                    "launched) VALUES (?, ?, ?, ?, ?, 'running', ?, ?)",
                    (name, new.generation, new.ranks[w.rank], w.node, w.local_rank, w.pid, now),
                )
            db.execute(
                "UPDATE tasks SET generation = ?, workers = ? WHERE name = ?",
                (new.generation, new.world_size, name),
            )
        for w in kept:
            self.pending.add(
                w.node,
                RenameWorker(
                    task=name,
                    generation=generation,
                    rank=w.rank,
                    new_generation=new.generation,
                    new_rank=new.ranks[w.rank],
                ),
            )
        self.rendezvous.set(name, membership_key(name, generation), new.model_dump_json())

    def _grow_in_process(self, name: str, placement: dict[str, int], reason: str) -> None:
        """Launch newcomers for the task's next generation; the live members make room for them
        at a step boundary once they are ready, and give them their state."""
        task = self.store.task(name)
        assert task is not None
        spec = self.spec(name)
        live = self.store.workers(name, task.generation, live=True)
        world = len(live) + sum(placement.values())
        generation = self._next_generation(name)
        new = Membership(generation=generation, world_size=world, ranks={w.rank: w.rank for w in live})
        newcomers = list(range(len(live), world))
        env = self._worker_env(name, spec, generation, world, task.store_port)
        env["UNICRON_JOINING"] = "1"
        now = time.time()
        placement = dict(placement)
        spares = [s for s in self.spares.values() if s.task == name and s.used is None]
        used = []
        with self.store.transaction() as db:
            rank = len(live)
            for spare in spares[: sum(placement.values())]:
                # A hot spare becomes this newcomer: no process to start, only a new identity.
                spare.used = now
                node = spare.node if placement.get(spare.node) else max(placement, key=lambda n: placement[n])
                placement[node] -= 1
                db.execute(
                    "UPDATE workers SET state = 'used' WHERE task = ? AND generation = ? AND rank = ?",
                    (name, SPARE_GENERATION, spare.rank),
                )
                db.execute(
                    "INSERT OR REPLACE INTO workers (task, generation, rank, node, local_rank, state, "
                    "launched) VALUES (?, ?, ?, ?, ?, 'launching', ?)",
                    (name, generation, rank, spare.node, spare.local_rank, now),
                )
                self.pending.add(
                    spare.node,
                    RenameWorker(
                        task=name,
                        generation=SPARE_GENERATION,
                        rank=spare.rank,
                        new_generation=generation,
                        new_rank=rank,
                    ),
                )
                identity = {"generation": generation, "rank": rank, "world_size": world}
                self.rendezvous.set(name, spare_key(name, spare.rank), json.dumps(identity))
                used.append(spare.rank)
                rank += 1
            placement = {n: c for n, c in placement.items() if c > 0}
            self._start_workers(db, name, spec, env, generation, world, placement, rank, now)
        self.growing[name] = _Growth(generation, new, newcomers, now)
        self.store.event(
            "task_grow",
            task=name,
            generation=generation,
            workers=world,
            placement=placement,
            spares_used=used,
            reason=reason,
        )

    def _cancel_growth(self, name: str) -> None:
        growth = self.growing.pop(name, None)
        if growth is None:
            return
        self._stop_generation(name, growth.generation, 0.0)
        with self.store.transaction() as db:
            db.execute(
                "UPDATE workers SET state = 'stopped' "
                "WHERE task = ? AND generation = ? AND state IN ('launching', 'running')",
                (name, growth.generation),
            )
        self.store.event("task_grow_cancelled", task=name, generation=growth.generation)

    def _next_generation(self, name: str) -> int:
        """A generation number never used by this task (a cancelled grow may have used one)."""
        row = self.store.one("SELECT MAX(generation) AS g FROM workers WHERE task = ?", name)
        task = self.store.task(name)
        assert task is not None
        used = int(row.g) if row is not None and row.g is not None else 0
        return max(int(task.generation), used) + 1

    def _check_growth(self, name: str, now: float) -> None:
        growth = self.growing[name]
        task = self.store.task(name)
        if task is None or task.state not in ("running", "starting"):
            del self.growing[name]
            return
        keys = [ready_key(name, growth.generation, r) for r in growth.newcomers]
        if self.rendezvous.ready(name, keys):
            live = self.store.workers(name, task.generation, live=True)
            self._switch(name, task.generation, growth.membership, live, now)
            self.store.update("tasks", {"name": name}, workers=growth.membership.world_size)
            self.store.event(
                "task_grown",
                task=name,
                generation=growth.generation,
                workers=growth.membership.world_size,
                waited_s=round(now - growth.since, 3),
            )
            del self.growing[name]
            self.dirty = True  # idle slots may want a new spare
        elif now - growth.since > self.limits.launch_timeout_s:
            self.store.event("task_grow_failed", task=name, generation=growth.generation)
            self._stop_generation(name, growth.generation, 0.0)
            del self.growing[name]

    def _recovered(self, name: str, downtime: float, step: int) -> None:
        for (task, generation), incident in list(self.incidents.items()):
            if task == name:
                self.store.event(
                    "outcome",
                    task=name,
                    incident=incident.id,
                    outcome="recovered",
                    downtime_s=round(downtime, 3),
                    resumed_step=step,
                    action=incident.action,
                )
                del self.incidents[(task, generation)]

    def _isolate(self, node: str, why: str) -> None:
        row = self.store.node(node)
        if row is None or row.state != "healthy":
            return
        self.store.update("nodes", {"name": node}, state="isolated")
        self.store.event("node_isolated", node=node, why=why, until=time.time() + self.limits.isolation_s)
        self.isolated_until[node] = time.time() + self.limits.isolation_s
        for w in self.store.query(
            "SELECT DISTINCT task, generation FROM workers WHERE node = ? "
            "AND state IN ('launching', 'running')",
            node,
        ):
            self.pending.add(
                node,
                StopWorkers(task=w.task, generation=w.generation, grace_s=self.limits.failure_stop_grace_s),
            )

    def _stop_generation(self, name: str, generation: int, grace_s: float) -> None:
        for w in self.store.workers(name, generation, live=True):
            node = self.store.node(w.node)
            if node is not None and node.state != "lost":
                self.pending.add(w.node, StopWorkers(task=name, generation=generation, grace_s=grace_s))

    # ------------------------------------------------------------------ the control loop
    def tick(self) -> None:
        now = time.time()
        if self.listening_since is None:
            self.listening_since = now
        for node in self.store.nodes():
            silent = now - max(node.last_seen, self.listening_since)
            if node.state != "lost" and silent > self.limits.heartbeat_deadline_s:
                self._node_lost(node.name, silent)
            elif node.state == "isolated" and now >= self.isolated_until.get(node.name, 0):
                self.store.update("nodes", {"name": node.name}, state="healthy")
                self.store.event("node_back", node=node.name, why="isolation over")
                self.dirty = True
        for (name, _generation), (since, kind, where) in list(self.awaiting.items()):
            if now - since > self.limits.heartbeat_deadline_s + 1.0:
                # No death was reported in time: whoever is alive rebuilds the group in place.
                self._incident(name, kind, where, "peers reported errors; no rank died", failed=set())
        for name in list(self.growing):
            self._check_growth(name, now)
        self.leaving = {k: due for k, due in self.leaving.items() if due > now - 60.0}
        for task in self.store.tasks(live_only=True):
            if task.state == "restarting":
                self._finish_stopping(task)
            elif task.state == "starting":
                stale = [
                    w
                    for w in self.store.workers(task.name, task.generation)
                    if w.state == "launching" and now - w.launched > self.limits.launch_timeout_s
                ]
                if stale:
                    self._incident(
                        task.name, ErrorKind.EXITED_ABNORMALLY, None, f"{len(stale)} worker(s) never started"
                    )
            elif task.state == "running":
                self._check_hang(task, now)
        if self.dirty and not any(t.state == "restarting" for t in self.store.tasks(live_only=True)):
            self.dirty = False
            self.reconcile()

    def _check_hang(self, task: Any, now: float) -> None:
        if (task.name, task.generation) in self.awaiting:
            return  # a failure is being handled
        if task.step >= self.spec(task.name).run.iterations:
            return  # training is over; the workers are saving and exiting
        monitor = self._monitor(task.name, task.generation)
        # One heartbeat more: the report of a step that did end may still be on its way.
        if not monitor.late(now - self.limits.heartbeat_interval_s):
            return
        workers = self.store.workers(task.name, task.generation, live=True)
        nodes = {n.name: n for n in self.store.nodes()}
        hosts = {w.node for w in workers}
        if any(now - nodes[h].last_seen > 2 * self.limits.heartbeat_interval_s for h in hosts if h in nodes):
            return  # a node of the task is silent: that is decided first (lost, or heard again)
        culprits = [w for w in workers if self.stopped.get((task.name, task.generation, w.rank))]
        self.store.event(
            "hang_detected",
            task=task.name,
            step=monitor.last_step + 1,
            mean_s=round(monitor.mean_interval() or 0.0, 4),
            waited_s=round(now - monitor.last_time, 3),
            deadline_s=round(monitor.deadline() or 0, 3),
            culprits=[w.rank for w in culprits],
            generation=task.generation,
        )
        # Kill the hung worker(s) at once: the hang becomes an ordinary death.
        for w in culprits:
            self.pending.add(
                w.node, StopWorkers(task=task.name, generation=task.generation, rank=w.rank, grace_s=0.0)
            )
        node = culprits[0].node if culprits else None
        self._incident(
            task.name,
            ErrorKind.TASK_HANG,
            node,
            f"step {monitor.last_step + 1} late; hung rank(s) {[w.rank for w in culprits] or 'unknown'}",
            failed={w.rank for w in culprits} or None,
        )

    def _node_lost(self, name: str, silent_s: float) -> None:
        self.store.update("nodes", {"name": name}, state="lost")
        self.store.event("node_lost", node=name, silent_s=round(silent_s, 3))
        self.pending.take(name)
        hit = {
            w.task
            for w in self.store.query(
                "SELECT DISTINCT task FROM workers WHERE node = ? AND state IN ('launching', 'running')", name
            )
        }
        gone: dict[str, set[int]] = {}
        for w in self.store.query(
            "SELECT w.task, w.rank FROM workers w JOIN tasks t ON t.name = w.task "
            "WHERE w.node = ? AND w.generation = t.generation AND w.state IN ('launching', 'running')",
            name,
        ):
            gone.setdefault(w.task, set()).add(w.rank)  # ranks of the task's current generation
        with self.store.transaction() as db:
            db.execute(
                "UPDATE workers SET state = 'lost' WHERE node = ? AND state IN ('launching', 'running')",
                (name,),
            )
        for task_name in hit:
            task = self.store.task(task_name)
            if task is not None and task.state in ("starting", "running"):
                self._incident(
                    task_name,
                    ErrorKind.NODE_LOST,
                    name,
                    f"node {name} silent for {silent_s:.1f} s",
                    failed=gone.get(task_name),
                )
            elif task is not None:
                self._root_cause(task_name, ErrorKind.NODE_LOST, name)
        self.dirty = True

    def _root_cause(self, name: str, kind: ErrorKind, node: str) -> None:
        """A later, surer verdict for an open incident: the peers' connection errors that opened it
        were symptoms of this (a lost node), which is now recorded as its root cause."""
        for (task, _), incident in self.incidents.items():
            if task == name and incident.kind in CONSEQUENCES:
                self.store.event(
                    "root_cause",
                    task=name,
                    node=node,
                    incident=incident.id,
                    kind=kind.value,
                    first_seen_as=incident.kind.value,
                )
                incident.kind = kind

    def _finish_stopping(self, task: Any) -> None:
        live = self.store.workers(task.name, task.generation, live=True)
        waited = time.time() - (task.down_since or time.time())
        if live and waited < self.limits.stop_grace_s * 3:
            return
        with self.store.transaction() as db:
            db.execute(
                "UPDATE workers SET state = 'stopped' "
                "WHERE task = ? AND generation = ? AND state IN ('launching', 'running')",
                (task.name, task.generation),
            )
        self.store.update("tasks", {"name": task.name}, state="waiting", workers=0)
        self.dirty = True

    # ------------------------------------------------------------------ placement
    def cluster_state(self) -> tuple[ClusterState, dict[int, str]]:
        nodes = [n for n in self.store.nodes() if n.state == "healthy"]
        names = {n.id: n.name for n in nodes}
        ids = {n.name: n.id for n in nodes}
        slots = nodes[0].slots if nodes else 1
        assignment: dict[int, dict[str, int]] = {}
        live = self.store.tasks(live_only=True)
        for task in live:
            if task.state in ("starting", "running"):
                for w in self.store.workers(task.name, task.generation, live=True):
                    if w.node in ids:
                        per = assignment.setdefault(ids[w.node], {})
                        per[task.name] = per.get(task.name, 0) + 1
        specs = [self.spec(t.name) for t in live]
        gpu = custom_gpu(1e12)
        curves: dict[str, ThroughputCurve] = {
            s.name: curve_for(s, gpu, slots, self.rates.measured(s.name)) for s in specs
        }
        state = ClusterState(
            slots,
            gpu,
            self.settings.node_mtbf_hours,
            PlannerSettings(),
            tuple(sorted(names)),
            assignment,
            tuple(specs),
            curves,
            next_node=max(names, default=0) + 1,
        )
        return state, names

    def reconcile(self) -> None:
        """Divide the healthy slots with the planner and carry the plan out: in place where the
        task recovers in process (shrink at a step boundary, grow with newcomers), else by a
        restart from the checkpoint."""
        state, names = self.cluster_state()
        if not state.tasks:
            return
        decided = self.allocator.decide(state, self.rates.version)
        best, layout = decided.plan, decided.layout
        if decided.rebalance:
            # Nothing happened but new measurements: move running tasks only for a clear gain.
            before = sum(d.waf_before for d in best.decisions)
            if best.waf < before * (1 + self.limits.rebalance_min_gain):
                self._keep_spares(state, names, {n: dict(a) for n, a in state.assignment.items()})
                return
        tasks = {t.name: t for t in self.store.tasks(live_only=True)}
        self._record_plan(decided, tasks)
        for decision in best.decisions:
            task = tasks[decision.task]
            wanted = {names[n]: per[task.name] for n, per in sorted(layout.items()) if per.get(task.name)}
            running = task.state in ("starting", "running")
            if running and (decision.after == task.workers or task.name in self.growing):
                continue
            if task.state == "starting":
                continue  # decide once it runs again (it may be recovering in place)
            if task.state == "running" and decision.after > task.workers and self._can_grow(task.name):
                # More slots for a running task: newcomers join its live replicas in place.
                current: dict[str, int] = {}
                for w in self.store.workers(task.name, task.generation, live=True):
                    current[w.node] = current.get(w.node, 0) + 1
                extra = {n: c - current.get(n, 0) for n, c in wanted.items() if c > current.get(n, 0)}
                if sum(extra.values()) == decision.after - task.workers:
                    self._grow_in_process(task.name, extra, decision.reason)
                    continue
            if (
                task.state == "running"
                and 0 < decision.after < task.workers
                and self._shrink_planned(task.name, wanted, decision.reason)
            ):
                continue
            if running:
                # No in-place change fits (the task asked for restarts, or it must stop or
                # move): stop at a step boundary with a checkpoint and relaunch as planned.
                self.store.event(
                    "task_resize",
                    task=task.name,
                    before=task.workers,
                    after=decision.after,
                    reason=decision.reason,
                )
                self._stop_generation(task.name, task.generation, self.limits.stop_grace_s)
                self.store.update(
                    "tasks",
                    {"name": task.name},
                    state="restarting",
                    down_since=task.down_since or time.time(),
                )
                self.dirty = True
                continue
            if decision.after > 0:
                self._launch(task.name, wanted, decision.reason)
            elif task.state == "waiting":
                self.store.update("tasks", {"name": task.name}, workers=0)
        self._keep_spares(state, names, layout)
        self.allocator.refresh(state, decided, self.rates.version)

    def _record_plan(self, decided: Decided, tasks: dict[str, Any]) -> None:
        """A plan event whenever the plan changes a task: where it came from and what it does."""
        changes = {
            d.task: [tasks[d.task].workers, d.after]
            for d in decided.plan.decisions
            if d.task in tasks and d.after != tasks[d.task].workers
        }
        if not changes or decided.plan.allocation() == self._last_plan:
            return  # nothing to change, or a change already under way
        self._last_plan = decided.plan.allocation()
        self.store.event(
            "plan",
            source=decided.source,
            answers=str(decided.event) if decided.event is not None else None,
            why=decided.why or None,
            seconds=round(decided.seconds, 6),
            allocation=decided.plan.allocation(),
            changes=changes,
            waf=decided.plan.waf,
        )

    def _shrink_planned(self, name: str, wanted: dict[str, int], reason: str) -> bool:
        """Give up workers the plan takes from a running task, in place: the members it keeps
        (those on the nodes the placement keeps) form the next generation at their next step
        boundary; the others leave there, having lost nothing. False when that does not fit."""
        task = self.store.task(name)
        assert task is not None
        spec = self.spec(name)
        if spec.run.recovery != "in_process" or name in self.growing:
            return False
        live = sorted(self.store.workers(name, task.generation, live=True), key=lambda w: w.rank)
        quota = dict(wanted)
        kept, left = [], []
        for w in live:
            if quota.get(w.node, 0) > 0:
                kept.append(w)
                quota[w.node] -= 1
            else:
                left.append(w)
        if not kept or not left or not spec.is_usable(len(kept)):
            return False
        new = Membership(
            generation=self._next_generation(name),
            world_size=len(kept),
            ranks={w.rank: i for i, w in enumerate(kept)},
        )
        now = time.time()
        self._switch(name, task.generation, new, kept, now)
        for w in left:
            # They leave at their next step boundary; one that does not is stopped.
            self.leaving[(name, task.generation, w.rank)] = now + self.limits.hang_cap_s
        self.store.event(
            "task_shrink",
            task=name,
            generation=new.generation,
            before=len(live),
            workers=len(kept),
            leaving=[w.rank for w in left],
            reason=reason,
        )
        self.dirty = True
        return True

    # ------------------------------------------------------------------ hot spares
    def _keep_spares(self, state: ClusterState, names: dict[int, str], layout: Assignment) -> None:
        """Stop spares whose slot the plan uses or whose task no longer runs; start spares on
        the slots the plan leaves idle, for the tasks that gain most from them."""
        now = time.time()
        tasks = {t.name: t for t in self.store.tasks(live_only=True)}
        planned = {names[n]: sum(per.values()) for n, per in layout.items()}
        healthy = set(names.values())
        for key, spare in list(self.spares.items()):
            task = tasks.get(spare.task)
            if spare.used is not None:
                if now - spare.used > self.limits.launch_timeout_s:
                    del self.spares[key]  # renamed long ago: it is an ordinary worker now
            elif spare.node not in healthy:
                self._drop_spare(key, stop=False)
            elif task is None or task.state not in ("running", "starting"):
                self._drop_spare(key, stop=True)
        waiting = [s for s in self.spares.values() if s.used is None]
        for node in sorted(healthy):
            here = [s for s in waiting if s.node == node]
            excess = planned.get(node, 0) + len(here) - state.gpus_per_node
            for spare in here[: max(0, excess)]:
                self._drop_spare((spare.task, spare.rank), stop=True)  # the plan needs its slot
        if self.limits.hot_spares == 0:
            return
        waiting = [s for s in self.spares.values() if s.used is None]
        free = {
            n: state.gpus_per_node - planned.get(n, 0) - sum(1 for s in waiting if s.node == n)
            for n in healthy
        }
        running = {n: t.workers for n, t in tasks.items() if t.state == "running" and n not in self.growing}
        gains = spare_gains([self.spec(n) for n in running], running, state.curves)
        have: dict[str, int] = {}
        for s in waiting:
            have[s.task] = have.get(s.task, 0) + 1
        homes: dict[str, set[str]] = {}
        for name in running:
            homes[name] = {w.node for w in self.store.workers(name, tasks[name].generation, live=True)}
        for name, node in choose(free, gains, have, homes, self.limits.hot_spares):
            self._launch_spare(name, node, now)

    def _launch_spare(self, name: str, node: str, now: float) -> None:
        task = self.store.task(name)
        assert task is not None
        spec = self.spec(name)
        row = self.store.one(
            "SELECT MAX(rank) AS r FROM workers WHERE task = ? AND generation = ?", name, SPARE_GENERATION
        )
        rank = max(1000, int(row.r) + 1 if row is not None and row.r is not None else 1000)
        env = {**self._worker_env(name, spec, SPARE_GENERATION, 0, task.store_port), "UNICRON_SPARE": "1"}
        with self.store.transaction() as db:
            self._start_workers(db, name, spec, env, SPARE_GENERATION, 0, {node: 1}, rank, now, "spare")
        local = self.store.one(
            "SELECT local_rank FROM workers WHERE task = ? AND generation = ? AND rank = ?",
            name,
            SPARE_GENERATION,
            rank,
        )
        assert local is not None
        self.spares[(name, rank)] = _Spare(name, rank, node, int(local.local_rank), now)
        self.store.event("spare_launched", task=name, node=node, rank=rank)

    def _drop_spare(self, key: tuple[str, int], stop: bool) -> None:
        spare = self.spares.pop(key, None)
        if spare is None:
            return
        if stop:
            self.pending.add(
                spare.node,
                StopWorkers(task=spare.task, generation=SPARE_GENERATION, rank=spare.rank, grace_s=0.0),
            )
        self.store.update(
            "workers",
            {"task": spare.task, "generation": SPARE_GENERATION, "rank": spare.rank},
            state="stopped",
        )
        self.store.event("spare_stopped", task=spare.task, node=spare.node, rank=spare.rank)

    def _can_grow(self, name: str) -> bool:
        return self.spec(name).run.recovery == "in_process" and name not in self.growing

    def _worker_env(
        self, name: str, spec: LiveTaskSpec, generation: int, world: int, port: int
    ) -> dict[str, str]:
        env = {
            "UNICRON_TASK": name,
            "UNICRON_GENERATION": str(generation),
            "UNICRON_WORLD_SIZE": str(world),
            "UNICRON_STORE": f"{self.settings.advertise_host}:{port}",
            "UNICRON_CHECKPOINT_DIR": str(self.settings.checkpoint_root / name),
            "UNICRON_ITERATIONS": str(spec.run.iterations),
            "UNICRON_CHECKPOINT_EVERY": str(spec.run.checkpoint_every),
            "UNICRON_PG_TIMEOUT": str(self.limits.process_group_timeout_s),
            "UNICRON_RECOVERY": spec.run.recovery,
            **spec.run.env,
        }
        if spec.run.faults:
            env["UNICRON_FAULTS"] = json.dumps([f.model_dump() for f in spec.run.faults])
        return env

    def _start_workers(
        self,
        db: Any,
        name: str,
        spec: LiveTaskSpec,
        env: dict[str, str],
        generation: int,
        world: int,
        placement: dict[str, int],
        first_rank: int,
        now: float,
        state: str = "launching",
    ) -> None:
        """Record and order workers for ``placement``: ranks from ``first_rank`` on, each on a
        local slot (device) no worker or spare of any task holds on its node."""
        rank = first_rank
        for node, count in placement.items():
            taken = {
                int(r["local_rank"])
                for r in db.execute(
                    "SELECT local_rank FROM workers "
                    "WHERE node = ? AND state IN ('launching', 'running', 'spare')",
                    (node,),
                ).fetchall()
            }
            free = [i for i in range(len(taken) + count) if i not in taken][:count]
            for local in free:
                db.execute(
                    "INSERT OR REPLACE INTO workers (task, generation, rank, node, local_rank, state, "
                    "launched) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (name, generation, rank, node, local, state, now),
                )
                self.pending.add(
                    node,
                    LaunchWorker(
                        task=name,
                        generation=generation,
                        rank=rank,
                        world_size=world,
                        local_rank=local,
                        argv=list(spec.run.program),
                        env={**env, "UNICRON_RANK": str(rank)},
                    ),
                )
                rank += 1

    def _launch(self, name: str, placement: dict[str, int], reason: str) -> None:
        task = self.store.task(name)
        assert task is not None
        spec = self.spec(name)
        generation = self._next_generation(name)
        world = sum(placement.values())
        port = self.rendezvous.host(name, task.store_port or 0)
        env = self._worker_env(name, spec, generation, world, port)
        now = time.time()
        with self.store.transaction() as db:
            self._start_workers(db, name, spec, env, generation, world, placement, 0, now)
            db.execute(
                "UPDATE tasks SET state = 'starting', generation = ?, workers = ?, store_port = ?, "
                "restarts = restarts + ?, started = COALESCE(started, ?) WHERE name = ?",
                (generation, world, port, 1 if generation > 1 else 0, now, name),
            )
        self.store.event(
            "task_launch",
            task=name,
            generation=generation,
            workers=world,
            placement=placement,
            resume_from=task.checkpoint_step,
            reason=reason,
        )

    def shutdown(self) -> None:
        self.allocator.close()
        self.rendezvous.close_all()
        self.store.close()

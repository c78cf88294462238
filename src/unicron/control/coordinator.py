"""The coordinator's logic: nodes, tasks, generations, placement by the planner, recovery.

All methods are synchronous and run on the service's event loop, one at a time, so they never
race. The HTTP layer (``control.service``) only translates requests into these calls.

Recovery in this milestone: a worker that fails makes its task stop every worker and start a new
generation from its latest checkpoint; a node whose heartbeats stop is lost, its tasks restart on
the remaining slots as the planner divides them; a node that comes back is planned in again.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from unicron.control.rendezvous import Rendezvous
from unicron.control.store import LIVE_TASK_STATES, Store
from unicron.core.errors import SpecError, SpecProblem, UsageError
from unicron.core.gpus import custom_gpu
from unicron.core.protocol import (
    CheckpointReport,
    DoneReport,
    ExceptionReport,
    ExitReport,
    Heartbeat,
    HeartbeatReply,
    IterationReport,
    LaunchWorker,
    Order,
    Registration,
    RegistrationReply,
    StopWorkers,
    WorkerReport,
)
from unicron.core.specs import LiveTaskSpec, PlannerSettings
from unicron.planning.placement import place
from unicron.planning.planner import ClusterState, plan
from unicron.planning.throughput import ThroughputCurve, curve_for


@dataclass(frozen=True)
class CoordinatorSettings:
    state_dir: Path
    checkpoint_root: Path
    advertise_host: str = "127.0.0.1"  # where workers reach the rendezvous stores
    heartbeat_interval_s: float = 0.5
    heartbeat_deadline_s: float = 2.5
    stop_grace_s: float = 3.0
    launch_timeout_s: float = 120.0
    node_mtbf_hours: float = 1000.0  # for the planner's expected run time


@dataclass
class _Pending:
    orders: dict[str, list[Order]] = field(default_factory=dict)

    def add(self, node: str, order: Order) -> None:
        self.orders.setdefault(node, []).append(order)

    def take(self, node: str) -> list[Order]:
        return self.orders.pop(node, [])


class Coordinator:
    def __init__(self, settings: CoordinatorSettings) -> None:
        self.settings = settings
        self.store = Store(settings.state_dir / "unicron.sqlite")
        self.rendezvous = Rendezvous(settings.advertise_host)
        self.pending = _Pending()
        self.dirty = True
        # Silence is counted from when the service can hear heartbeats at all: after a restart
        # every known node gets a full deadline to reconnect (its workers kept training).
        self.listening_since: float | None = None
        for task in self.store.tasks(live_only=True):
            if task.store_port:
                port = self.rendezvous.host(task.name, task.store_port)
                if port != task.store_port:
                    self.store.update("tasks", {"name": task.name}, store_port=port)
        self.store.event("coordinator_started", tasks=len(self.store.tasks(live_only=True)))

    # ------------------------------------------------------------------ user API
    def submit(self, spec: LiveTaskSpec) -> None:
        if self.store.task(spec.name) is not None:
            raise SpecError(
                "request",
                [SpecProblem("name", f"a task named {spec.name!r} exists", "choose another name")],
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
        self._stop_generation(name, task.generation)
        self.store.update("tasks", {"name": name}, state="cancelled", finished=time.time())
        self.store.event("task_cancelled", task=name)
        self.rendezvous.close(name)
        self.dirty = True

    def spec(self, name: str) -> LiveTaskSpec:
        task = self.store.task(name)
        assert task is not None
        return LiveTaskSpec.model_validate_json(task.spec)

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
        with self.store.transaction() as db:
            if known is None:
                db.execute(
                    "INSERT INTO nodes (name, slots, gpus, host, state, last_seen) "
                    "VALUES (?, ?, ?, ?, 'healthy', ?)",
                    (reg.node, reg.slots, json.dumps(reg.gpus), reg.host, now),
                )
            else:
                db.execute(
                    "UPDATE nodes SET slots = ?, gpus = ?, host = ?, state = 'healthy', last_seen = ? "
                    "WHERE name = ?",
                    (reg.slots, json.dumps(reg.gpus), reg.host, now, reg.node),
                )
        if known is None or known.state != "healthy":
            self.store.event("node_joined" if known is None else "node_back", node=reg.node, slots=reg.slots)
            self.dirty = True
        self._reconcile_workers(reg.node, reg.workers)
        return RegistrationReply(
            node=reg.node,
            heartbeat_interval_s=self.settings.heartbeat_interval_s,
            heartbeat_deadline_s=self.settings.heartbeat_deadline_s,
        )

    def heartbeat(self, hb: Heartbeat) -> HeartbeatReply:
        node = self.store.node(hb.node)
        if node is None or node.state != "healthy":
            # Unknown, or declared lost: it must register again (and its stale workers stop).
            return HeartbeatReply(registered=False)
        self.store.update("nodes", {"name": hb.node}, last_seen=time.time())
        for report in hb.reports:
            self.handle_report(report, hb.node)
        self._reconcile_workers(hb.node, hb.workers)
        return HeartbeatReply(orders=self.pending.take(hb.node))

    def _reconcile_workers(self, node: str, reported: list[Any]) -> None:
        """Stop workers the agent runs that belong to no live generation."""
        for w in reported:
            task = self.store.task(w.task)
            current = task is not None and task.state in LIVE_TASK_STATES and task.generation == w.generation
            if not current and w.running:
                self.pending.add(
                    node,
                    StopWorkers(task=w.task, generation=w.generation, grace_s=self.settings.stop_grace_s),
                )
            elif current:
                row = self.store.one(
                    "SELECT state FROM workers WHERE task = ? AND generation = ? AND rank = ?",
                    w.task,
                    w.generation,
                    w.rank,
                )
                if row is not None and row.state == "launching" and w.running:
                    self.store.update(
                        "workers",
                        {"task": w.task, "generation": w.generation, "rank": w.rank},
                        state="running",
                        pid=w.pid,
                    )

    # ------------------------------------------------------------------ reports
    def handle_report(self, report: WorkerReport, node: str) -> None:
        task = self.store.task(report.task)
        if task is None or report.generation != task.generation:
            return  # stale: from a generation that is gone
        if isinstance(report, IterationReport):
            self._iteration(task, report)
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

    def _iteration(self, task: Any, report: IterationReport) -> None:
        spec = self.spec(task.name)
        values: dict[str, Any] = {"samples": task.samples + report.samples}
        if spec.run.flops_per_sample:
            values["flop"] = task.flop + spec.weight * spec.run.flops_per_sample * report.samples
        if report.rank == 0:
            values["step"] = max(task.step, report.step)
            if task.state == "starting":
                values["state"] = "running"
                if task.down_since is not None:
                    values["downtime_s"] = task.downtime_s + time.time() - task.down_since
                    values["down_since"] = None
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
        if not ok and task.state in ("starting", "running"):
            how = f"signal {report.signal}" if report.signal else f"code {report.code}"
            self._fail(
                task.name,
                f"rank {report.rank} on {report.node} exited with {how}",
                "exited_abnormally",
                node=report.node,
            )
        elif ok and task.state == "running" and task.step < self.spec(task.name).run.iterations:
            # A clean exit before the end (stopped from outside): its peers cannot go on.
            self._fail(
                task.name,
                f"rank {report.rank} on {report.node} exited before the last step",
                "exited_abnormally",
                node=report.node,
            )
        elif ok:
            live = self.store.workers(report.task, report.generation, live=True)
            # Finished: every worker of the generation exited cleanly after the last step (a
            # generation that resumed from the final checkpoint finishes without iterating).
            done = task.step >= self.spec(task.name).run.iterations
            if not live and task.state in ("starting", "running") and done:
                self.store.update("tasks", {"name": task.name}, state="finished", finished=time.time())
                self.store.event("task_finished", task=task.name, step=task.step, digest=task.digest)
                self.rendezvous.close(task.name)
                self.dirty = True

    def _fail(self, name: str, why: str, kind: str, node: str | None = None) -> None:
        """A failure in the current generation: stop it; the loop starts the next one."""
        task = self.store.task(name)
        assert task is not None
        self.store.event(
            "task_failure",
            task=name,
            node=node,
            kind=kind,
            why=why,
            generation=task.generation,
            step=task.step,
            checkpoint_step=task.checkpoint_step,
        )
        self._stop_generation(name, task.generation)
        self.store.update(
            "tasks",
            {"name": name},
            state="restarting",
            failures=task.failures + 1,
            down_since=task.down_since or time.time(),
        )
        self.dirty = True

    def _stop_generation(self, name: str, generation: int) -> None:
        for w in self.store.workers(name, generation, live=True):
            node = self.store.node(w.node)
            if node is not None and node.state == "healthy":
                self.pending.add(
                    w.node, StopWorkers(task=name, generation=generation, grace_s=self.settings.stop_grace_s)
                )
        # Deduplicate: one stop per node is enough.
        for node_name, orders in self.pending.orders.items():
            seen: set[tuple[str, int | None]] = set()
            unique: list[Order] = []
            for o in orders:
                if isinstance(o, StopWorkers):
                    if (o.task, o.generation) in seen:
                        continue
                    seen.add((o.task, o.generation))
                unique.append(o)
            self.pending.orders[node_name] = unique

    # ------------------------------------------------------------------ the control loop
    def tick(self) -> None:
        now = time.time()
        if self.listening_since is None:
            self.listening_since = now
        for node in self.store.nodes():
            silent = now - max(node.last_seen, self.listening_since)
            if node.state == "healthy" and silent > self.settings.heartbeat_deadline_s:
                self._node_lost(node.name, silent)
        for task in self.store.tasks(live_only=True):
            if task.state == "restarting":
                self._finish_stopping(task)
            elif task.state == "starting":
                stale = [
                    w
                    for w in self.store.workers(task.name, task.generation)
                    if w.state == "launching" and now - w.launched > self.settings.launch_timeout_s
                ]
                if stale:
                    self._fail(task.name, f"{len(stale)} worker(s) never started", "exited_abnormally")
        if self.dirty and not any(t.state == "restarting" for t in self.store.tasks(live_only=True)):
            self.dirty = False
            self.reconcile()

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
        with self.store.transaction() as db:
            db.execute(
                "UPDATE workers SET state = 'lost' WHERE node = ? AND state IN ('launching', 'running')",
                (name,),
            )
        for task_name in hit:
            task = self.store.task(task_name)
            if task is not None and task.state in ("starting", "running"):
                self._fail(task_name, f"node {name} lost", "node_lost", node=name)
        self.dirty = True

    def _finish_stopping(self, task: Any) -> None:
        live = self.store.workers(task.name, task.generation, live=True)
        waited = time.time() - (task.down_since or time.time())
        if live and waited < self.settings.stop_grace_s * 3:
            return
        with self.store.transaction() as db:
            db.execute(
                "UPDATE workers SET state = 'stopped' "
                "WHERE task = ? AND generation = ? AND state IN ('launching', 'running')",
                (task.name, task.generation),
            )
        self.store.update("tasks", {"name": task.name}, state="waiting", workers=0)
        self.dirty = True

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
        curves: dict[str, ThroughputCurve] = {s.name: curve_for(s, gpu, slots) for s in specs}
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
        """Divide the healthy slots with the planner and start or resize tasks to match."""
        state, names = self.cluster_state()
        if not state.tasks:
            return
        best = plan(state)
        layout = place(best.allocation(), state.healthy, state.gpus_per_node, state.assignment)
        for decision in best.decisions:
            task = self.store.task(decision.task)
            assert task is not None
            running = task.state in ("starting", "running")
            if running and decision.after == task.workers:
                continue
            if running:
                # A different count: this milestone resizes by a restart from the checkpoint.
                self.store.event(
                    "task_resize",
                    task=task.name,
                    before=task.workers,
                    after=decision.after,
                    reason=decision.reason,
                )
                self._stop_generation(task.name, task.generation)
                self.store.update(
                    "tasks",
                    {"name": task.name},
                    state="restarting",
                    down_since=task.down_since or time.time(),
                )
                self.dirty = True
                continue
            if decision.after > 0:
                placement = {
                    names[n]: per[task.name] for n, per in sorted(layout.items()) if task.name in per
                }
                self._launch(task.name, placement, decision.reason)
            elif task.state == "waiting":
                self.store.update("tasks", {"name": task.name}, workers=0)

    def _launch(self, name: str, placement: dict[str, int], reason: str) -> None:
        task = self.store.task(name)
        assert task is not None
        spec = self.spec(name)
        generation = task.generation + 1
        world = sum(placement.values())
        port = task.store_port or 0
        port = self.rendezvous.host(name, port)
        checkpoint_dir = self.settings.checkpoint_root / name
        env = {
            "UNICRON_TASK": name,
            "UNICRON_GENERATION": str(generation),
            "UNICRON_WORLD_SIZE": str(world),
            "UNICRON_STORE": f"{self.settings.advertise_host}:{port}",
            "UNICRON_CHECKPOINT_DIR": str(checkpoint_dir),
            "UNICRON_ITERATIONS": str(spec.run.iterations),
            "UNICRON_CHECKPOINT_EVERY": str(spec.run.checkpoint_every),
            **spec.run.env,
        }
        now = time.time()
        rank = 0
        with self.store.transaction() as db:
            for node, count in placement.items():
                for local in range(count):
                    db.execute(
                        "INSERT INTO workers (task, generation, rank, node, local_rank, state, launched) "
                        "VALUES (?, ?, ?, ?, ?, 'launching', ?)",
                        (name, generation, rank, node, local, now),
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
        self.rendezvous.close_all()
        self.store.close()

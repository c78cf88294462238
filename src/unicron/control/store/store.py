"""The coordinator's durable state: nodes, tasks, workers (slots held per generation), the
iterations already counted, and events, over a backend (``backend.py``: SQLite or etcd).

Every operation is named for what it does and returns typed records (``brain/records.py``). The state
is held in memory and read from there; a change is decided there, written through the backend
at once (all its rows or none), and only then applied in memory, so a restarted coordinator
loses nothing and a refused write (:class:`Fenced`: another coordinator leads) changes nothing.
State changes are checked against the transition tables of ``core.states``: an illegal one
raises :class:`IllegalTransition` and writes nothing.

A node's ``last_seen`` is the one field kept in memory only between its other changes: writing
every heartbeat (four thousand a second at 2,048 agents) would load the backend for nothing,
since a coordinator that starts gives every node a full deadline anyway (``silent_nodes``).
The workers' rows are held with the indexes they are read by (``workerrows.py``).
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from unicron.brain.records import (
    EventRecord,
    NodeRecord,
    TaskRecord,
    WorkerRecord,
    drained_across,
)
from unicron.brain.snapshot import Snapshot
from unicron.control.store.backend import Backend
from unicron.control.store.batch import Batch
from unicron.control.store.journal import Journal
from unicron.control.store.unheard import Unheard
from unicron.control.store.workerrows import WorkerRows
from unicron.core.errors import Conflict, NotFound
from unicron.core.kept import K, Kept, kept_name, read_kept
from unicron.core.states import (
    LIVE_TASK_STATES,
    LIVE_WORKER_PHASES,
    NODE_TRANSITIONS,
    SLOT_HOLDING_PHASES,
    TASK_TRANSITIONS,
    WORKER_TRANSITIONS,
    NodeState,
    TaskState,
    WorkerPhase,
    check,
    sources,
)

PLAN_EVENT = "plan"  # the planner's answer, recorded by ``control/place/placing.py``


def _new_task(name: str, spec_json: str, now: float) -> TaskRecord:
    """A task just submitted: waiting, nothing launched."""
    return TaskRecord(
        name=name, spec=spec_json, state=TaskState.WAITING, generation=0, workers=0, step=0,
        checkpoint_step=0, store_port=0, failures=0, restarts=0, down_since=None,
        downtime_s=0.0, samples=0, flop=0.0, digest=None, submitted=now, started=None,
        finished=None, reason=None, launched_generation=0, redo_until=0,
    )  # fmt: skip


class Store:
    def __init__(self, backend: Backend, journal: Journal | None = None) -> None:
        """``journal``: write behind (the service's way, ``journal.py``); without one, each
        change is written before it is held (tests, tools)."""
        self.backend, self.journal = backend, journal
        self._lock = threading.RLock()
        loaded = backend.load()
        self._next_event = loaded.last_event_id + 1
        self._tasks = {t.name: t for t in sorted(loaded.tasks, key=lambda t: t.submitted)}
        self._nodes = {n.name: n for n in sorted(loaded.nodes, key=lambda n: n.id)}
        self._rows = WorkerRows()
        # Each task's part of a snapshot (its generation, the live members of it, a generation
        # it never used), read again only after a row of the task changes: a heartbeat changes
        # the whole snapshot's nodes, and sorting every task's members again for it (16,384
        # rows at 2,048 nodes) was most of a node loss's tick.
        self._parts: dict[str, tuple[int, tuple[WorkerRecord, ...], int, Mapping[str, int]]] = {}
        self._hold(loaded.workers)
        self._counted = dict(loaded.counted)
        self._kept = dict(loaded.kept)
        self._next_node_id = max((n.id for n in loaded.nodes), default=0) + 1
        # Counts every node added or removed and every change of a node's state or domain: what
        # is read of every node (the healthy ones' names, the silence sweep's nodes in service
        # and their domains) is read again only after one (a heartbeat changes only its times).
        self.node_changes = 0
        self._healthy: tuple[int, frozenset[str]] | None = None  # (at node_changes, the names)
        self._unheard = Unheard(self._nodes)  # the nodes by when they were last heard
        # Every change to what is held counts one (a heartbeat's ``last_seen`` too): a snapshot
        # of the whole cluster is read again only after one (a plan's tick read three alike, at
        # 100 tasks the members of all of them each time). A snapshot is never changed.
        self._version = 0
        self._whole: tuple[int, Snapshot] | None = None

    def _commit(self, batch: Batch) -> None:
        """Write ``batch`` through the backend, then (only if that worked) hold it in memory;
        with a journal, hold it and queue its write."""
        self._version += 1
        if self.journal is None:
            self.backend.write(batch.changes())
        else:
            self.journal.put(batch)  # (its rows made by the journal's writer)
        for t in batch.tasks:
            self._tasks[t.name] = t
        for n in batch.nodes:
            before = self._nodes.get(n.name)
            if before is None or before.state is not n.state or before.domain != n.domain:
                self.node_changes += 1
            self._nodes[n.name] = n
            if before is None or before.last_seen != n.last_seen:
                self._unheard.heard(n.name, n.last_seen, self._nodes)
        if batch.removed_nodes:
            self.node_changes += 1
        self._hold(batch.workers)
        self._counted.update(batch.counted)
        self._kept.update(batch.kept)
        for name in batch.dropped:
            self._kept.pop(name, None)
        for name in batch.removed_nodes:
            self._nodes.pop(name, None)
            self._unheard.forget(name)

    def snapshot(self, only: str | None = None) -> Snapshot:
        """Live tasks (``only``: that one alone), nodes and each live task's current members, in
        one read. A decision about one task reads only it: at 100 tasks, the members of all of
        them were most of a recovery's time."""
        with self._lock:
            if only is None and self._whole is not None and self._whole[0] == self._version:
                return self._whole[1]
            tasks = [t for t in self.tasks(live_only=True) if only is None or t.name == only]
            parts = {t.name: self._part(t) for t in tasks}
            snapshot = Snapshot(
                tasks={t.name: t for t in tasks},
                nodes=dict(self._nodes),
                members={name: part[1] for name, part in parts.items()},
                next_generation={name: part[2] for name, part in parts.items()},
                spreads={name: (part[1], part[3]) for name, part in parts.items()},
            )
            object.__setattr__(snapshot, "healthy_names", self._healthy_names())
            if only is None:
                self._whole = (self._version, snapshot)
            return snapshot

    def _part(self, task: TaskRecord) -> tuple[int, tuple[WorkerRecord, ...], int, Mapping[str, int]]:
        """``task``'s part of a snapshot (its generation, live members, next generation, members
        on each node), kept until one of its rows changes (``_hold``) or it moves to another
        generation."""
        part = self._parts.get(task.name)
        if part is None or part[0] != task.generation:
            with self._lock:
                ranked = self._rows.ranked(task.name, task.generation)
            following = max(task.generation, self.max_generation(task.name)) + 1
            part = (task.generation, ranked.live, following, ranked.spread)
            self._parts[task.name] = part
        return part

    def _healthy_names(self) -> frozenset[str]:
        """Read once between node changes (a heartbeat changes only a node's ``last_seen``): at
        2,048 nodes, finding them took a tenth of a crash's decision."""
        if self._healthy is None or self._healthy[0] != self.node_changes:
            healthy = frozenset(n.name for n in self._nodes.values() if n.state is NodeState.HEALTHY)
            self._healthy = (self.node_changes, healthy)
        return self._healthy[1]

    # ------------------------------------------------------------ tasks
    def task(self, name: str) -> TaskRecord | None:
        return self._tasks.get(name)

    def get_task(self, name: str) -> TaskRecord:
        task = self.task(name)
        if task is None:
            raise NotFound(f"no task named {name!r}")
        return task

    def tasks(self, live_only: bool = False) -> list[TaskRecord]:
        with self._lock:
            return [t for t in self._tasks.values() if not live_only or t.state in LIVE_TASK_STATES]

    def add_task(self, name: str, spec_json: str, now: float) -> None:
        with self._lock:
            if name in self._tasks:
                raise Conflict(f"a task named {name!r} exists; choose another name")
            self._commit(Batch(tasks=[_new_task(name, spec_json, now)]))

    def replace_task(self, name: str, spec_json: str, now: float) -> str:
        """Submit ``name`` again once its task has ended: that task is kept, renamed NAME#RUN
        (returned), and a new one of the name, its next run, waits. Its workers' rows stay under
        the name, and the new run's generations follow theirs: a worker's identity (task,
        generation, rank), which the agents, their logs, the reports and the rendezvous keys
        use, always names one process."""
        with self._lock:
            old = self.get_task(name)
            if old.state.live:
                raise Conflict(f"task {name!r} is {old.state.value}: cancel it first")
            kept = replace(old, name=f"{name}#{old.run}")
            if kept.name in self._tasks:
                raise Conflict(f"a task named {kept.name!r} exists already")
            first = max(old.generation, self.max_generation(name)) + 1
            new = replace(_new_task(name, spec_json, now), run=old.run + 1, first_generation=first)
            self._commit(Batch(tasks=[kept, new]))
            self._tasks[name] = self._tasks.pop(name)  # listed after the one it replaced
            self._version += 1
            return kept.name

    def _moved(self, name: str, to: TaskState, **changes: Any) -> None:
        """Move task ``name`` to state ``to`` (a legal transition) with ``changes``, at once."""
        with self._lock:
            task = self.get_task(name)
            check(f"task {name}", TASK_TRANSITIONS, task.state, to)
            self._commit(Batch(tasks=[replace(task, state=to, **changes)]))

    def _changed(self, name: str, **changes: Any) -> None:
        """Change fields of task ``name`` (nothing happens to a task that is unknown)."""
        with self._lock:
            if (task := self.task(name)) is not None:
                self._commit(Batch(tasks=[replace(task, **changes)]))

    def task_launched(self, name: str, generation: int, workers: int, port: int, now: float) -> None:
        """A generation was launched from a checkpoint (the first launch or a restart)."""
        task = self.get_task(name)
        self._moved(
            name, TaskState.STARTING, generation=generation, launched_generation=generation,
            workers=workers, store_port=port, restarts=task.restarts + int(task.started is not None),
            started=task.started if task.started is not None else now, redo_until=task.step,
        )  # fmt: skip

    def task_down(
        self, name: str, to: TaskState, now: float, reason: str | None = None, began: float | None = None
    ) -> None:
        """A failure that began at ``began`` (None: now) took the task down: it recovers
        (starting in place, or restarting) or fails. Its downtime counts from the earliest
        failure it has not recovered from; a failed task's stops at its failure."""
        task = self.get_task(name)
        down_from = min(t for t in (task.down_from, began, now) if t is not None)
        changes: dict[str, Any] = {"down_from": down_from}
        if to is TaskState.FAILED:
            changes = {"down_from": None, "downtime_s": task.downtime_s + max(0.0, now - down_from)}
        self._moved(
            name, to, failures=task.failures + 1,
            down_since=task.down_since if task.down_since is not None else now,
            finished=now if to is TaskState.FAILED else task.finished,
            reason=reason if reason is not None else task.reason, **changes,
        )  # fmt: skip

    def task_stopping(self, name: str, now: float) -> None:
        """The plan stops the task's generation at a step boundary, to relaunch it: down from
        now (unless a failure took it down earlier)."""
        task = self.get_task(name)
        down = task.down_since if task.down_since is not None else now
        down_from = task.down_from if task.down_from is not None else now
        self._moved(name, TaskState.RESTARTING, down_since=down, down_from=down_from)

    def task_ended(self, name: str, to: TaskState, now: float, reason: str | None = None) -> None:
        """Finished, cancelled or failed (without a new failure to count): a downtime under way
        ends with it."""
        task = self.get_task(name)
        downtime = task.downtime(now)
        self._moved(
            name, to, finished=now, reason=reason if reason is not None else task.reason,
            downtime_s=downtime, down_from=None,
        )  # fmt: skip

    def task_waiting(self, name: str) -> None:
        """No workers: stopped for a relaunch, or queued with no slots for it."""
        self._moved(name, TaskState.WAITING, workers=0)

    def task_running(self, name: str, now: float) -> float | None:
        """The generation completed a step; returns the downtime that ended, if any."""
        with self._lock:
            task = self.get_task(name)
            down = max(0.0, now - task.down_from) if task.down_from is not None else None
            self._moved(
                name, TaskState.RUNNING, downtime_s=task.downtime_s + (down or 0.0),
                down_since=None, down_from=None,
            )  # fmt: skip
            return down

    def task_membership(self, name: str, generation: int, workers: int) -> None:
        """The task's workers now form ``generation`` (in place: nothing restarted)."""
        self._changed(name, generation=generation, workers=workers)

    def task_store_port(self, name: str, port: int) -> None:
        self._changed(name, store_port=port)

    def task_checkpointed(self, name: str, step: int) -> None:
        with self._lock:
            if (task := self.task(name)) is not None:
                self._changed(name, checkpoint_step=max(task.checkpoint_step, step))

    def task_done(self, name: str, step: int, digest: str) -> None:
        with self._lock:
            if (task := self.task(name)) is not None:
                self._changed(name, digest=digest, step=max(task.step, step))

    def count_iteration(
        self, name: str, generation: int, rank: int, step: int, samples: int, flop: float
    ) -> bool:
        """Count a rank's completed step once: False (nothing counted) for a report seen before.
        A step trained again after a restart from a checkpoint (up to ``redo_until``) is not
        progress: it adds nothing to the samples and FLOP achieved (the WAF). The generation's
        first step (rank 0's first) was trained by every member from one state: its newcomers
        hold it now (``WorkerRecord.joining``)."""
        with self._lock:
            key = (name, generation, rank)
            if (seen := self._counted.get(key)) is not None and seen >= step:
                return False
            batch = Batch(counted={key: step})
            if rank == 0 and seen is None:
                joined = self.workers(name, generation, live=True)
                batch.workers = [replace(w, joining=False) for w in joined if w.joining]
            if (task := self.task(name)) is not None:
                progress = step > task.redo_until
                batch.tasks.append(
                    replace(
                        task,
                        samples=task.samples + (samples if progress else 0),
                        flop=task.flop + (flop if progress else 0.0),
                        step=max(task.step, step),
                    )
                )
            self._commit(batch)
            return True

    # ------------------------------------------------------------ nodes
    def node(self, name: str) -> NodeRecord | None:
        return self._nodes.get(name)

    def nodes(self) -> list[NodeRecord]:
        with self._lock:
            return list(self._nodes.values())

    def unheard_since(self, cutoff: float) -> list[NodeRecord]:
        """The nodes last heard before ``cutoff`` (by id), found without reading every node."""
        with self._lock:
            return self._unheard.since(cutoff, self._nodes)

    def another_node(self, name: str) -> NodeRecord | None:
        """Any node but ``name`` (the first registered), without a pass over them all."""
        with self._lock:
            return next((n for n in self._nodes.values() if n.name != name), None)

    def node_registered(
        self,
        name: str,
        slots: int,
        gpus: list[str],
        host: str,
        state: NodeState,
        now: float,
        probe_port: int = 0,
        domain: str | None = None,
    ) -> None:
        with self._lock:
            known = self.node(name)
            if known is None:
                node = NodeRecord(
                    self._next_node_id, name, slots, list(gpus), host, state, now, probe_port, domain
                )
                self._next_node_id += 1
            else:
                check(f"node {name}", NODE_TRANSITIONS, known.state, state)
                node = replace(
                    known,
                    slots=slots,
                    gpus=list(gpus),
                    host=host,
                    state=state,
                    last_seen=now,
                    probe_port=probe_port,
                    domain=domain,
                    drained=drained_across(known, state),
                )
            self._commit(Batch(nodes=[node]))

    def node_seen(self, name: str, now: float) -> None:
        """A heartbeat: held in memory only (see the module's docstring)."""
        with self._lock:
            if (node := self.node(name)) is not None:
                self._nodes[name] = replace(node, last_seen=now)
                self._unheard.heard(name, now, self._nodes)
                self._version += 1

    def remove_node(self, name: str) -> None:
        with self._lock:
            self._commit(Batch(removed_nodes=[name]))

    def node_state(self, name: str, to: NodeState) -> None:
        with self._lock:
            node = self.node(name)
            if node is None:
                raise NotFound(f"no node named {name!r}")
            check(f"node {name}", NODE_TRANSITIONS, node.state, to)
            self._commit(Batch(nodes=[replace(node, state=to, drained=drained_across(node, to))]))

    # ------------------------------------------------------------ workers
    def workers(self, task: str, generation: int | None = None, live: bool = False) -> list[WorkerRecord]:
        with self._lock:
            if generation is not None:
                ranked = self._rows.ranked(task, generation)
                return list(ranked.live if live else ranked.rows)
            found = self._rows.of_task(task, live)
        return sorted(found, key=lambda w: (w.generation, w.rank))

    def launching(self, task: str, generation: int) -> tuple[WorkerRecord, ...]:
        """The generation's rows still launching (ordered, not yet seen running), by rank."""
        with self._lock:
            return self._rows.ranked(task, generation).launching

    def worker(self, task: str, generation: int, rank: int) -> WorkerRecord | None:
        return self._rows.row(task, generation, rank)

    def _hold(self, rows: Iterable[WorkerRecord]) -> None:
        """Hold ``rows``; each task they are of has its snapshot part read again."""
        for task in self._rows.hold(rows):
            self._parts.pop(task, None)

    def workers_in(self, phases: Iterable[WorkerPhase]) -> list[WorkerRecord]:
        """Rows in ``phases``, slot-holding ones only: read from their index, not every row."""
        with self._lock:
            return self._rows.holding(phases)

    def holding_on(self, node: str) -> list[WorkerRecord]:
        """The rows holding a slot on ``node`` (any task's workers, spares), from their index."""
        with self._lock:
            return self._rows.holding_on(node)

    def live_workers_on(self, node: str) -> list[WorkerRecord]:
        live = set(LIVE_WORKER_PHASES)
        return sorted((w for w in self.holding_on(node) if w.state in live), key=lambda w: w.key)

    def slots_in_use(self) -> dict[str, int]:
        """node -> processes holding a local slot there (workers of any task, hot spares)."""
        return dict(Counter(w.node for w in self.workers_in(SLOT_HOLDING_PHASES)))

    def held_slots(self) -> dict[str, dict[str, int]]:
        """node -> task -> live workers there."""
        held: dict[str, dict[str, int]] = {}
        for w in self.workers_in(LIVE_WORKER_PHASES):
            held.setdefault(w.node, Counter())[w.task] += 1
        return held

    def max_generation(self, task: str) -> int:
        with self._lock:
            return self._rows.max_generation(task)

    def max_rank(self, task: str, generation: int) -> int | None:
        with self._lock:
            return self._rows.max_rank(task, generation)

    def add_workers(
        self,
        task: str,
        generation: int,
        placement: dict[str, int],
        first_rank: int,
        phase: WorkerPhase,
        now: float,
        joining: bool = False,
    ) -> list[WorkerRecord]:
        """Record workers for ``placement`` (node -> count), ranks from ``first_rank`` on, each on
        a local slot (device) that no worker or spare of any task holds on its node (``joining``:
        a grow's newcomers, ``WorkerRecord.joining``)."""
        with self._lock:
            added: list[WorkerRecord] = []
            rank = first_rank
            for node, count in placement.items():
                taken = {w.local_rank for w in self.holding_on(node)}
                for local in [i for i in range(len(taken) + count) if i not in taken][:count]:
                    added.append(
                        WorkerRecord(
                            task, generation, rank, node, local, phase, None, None, None, now, joining
                        )
                    )
                    rank += 1
            self._commit(Batch(workers=added))
            return list(added)  # (the batch's own list is read by the journal's writer)

    def worker_phase(
        self,
        key: tuple[str, int, int],
        to: WorkerPhase,
        pid: int | None = None,
        code: int | None = None,
        signal: int | None = None,
    ) -> bool:
        """Move one worker to ``to``; False when it is unknown or already ended (a late report
        about a worker that was since declared lost or stopped changes nothing)."""
        with self._lock:
            worker = self.worker(*key)
            if worker is None:
                return False
            if worker.state != to and not WORKER_TRANSITIONS[worker.state]:
                return False  # ended already: the first verdict stands
            check(f"worker {key}", WORKER_TRANSITIONS, worker.state, to)
            moved = replace(
                worker,
                state=to,
                pid=pid if pid is not None else worker.pid,
                exit_code=code if code is not None else worker.exit_code,
                exit_signal=signal if signal is not None else worker.exit_signal,
            )
            self._commit(Batch(workers=[moved]))
            return True

    def _ended(self, workers: Iterable[WorkerRecord], to: WorkerPhase) -> list[WorkerRecord]:
        return [w.in_state(to) for w in workers]

    def end_workers(self, task: str, generation: int, to: WorkerPhase) -> None:
        """Every live worker of a generation becomes ``to`` (stopped, or moved to the next one)."""
        entering = set(sources(WORKER_TRANSITIONS, to))
        with self._lock:
            chosen = [w for w in self.workers(task, generation, live=True) if w.state.value in entering]
            self._commit(Batch(workers=self._ended(chosen, to)))

    def switch_generation(
        self, task: str, old: int, new: int, kept: Sequence[tuple[WorkerRecord, int]], now: float
    ) -> None:
        """Survivors ``kept`` (each with its new rank) form generation ``new``: their rows of ``old``
        become moved, each gets a running row in ``new``, and the task follows, in one commit."""
        with self._lock:
            # (in the order held, not sorted by rank: a batch's rows need none)
            members = self._rows.of_generation(task, old)
            batch = Batch(workers=self._ended([w for w in members if w.state.live], WorkerPhase.MOVED))
            batch.workers += [w.in_generation(new, rank, now) for w, rank in kept]
            if (record := self.task(task)) is not None:
                batch.tasks.append(replace(record, generation=new, workers=len(kept)))
            self._commit(batch)

    def spare_used(
        self, task: str, spare_rank: int, generation: int, rank: int, node: str, local: int, now: float
    ) -> None:
        """A hot spare takes a newcomer's identity: its spare row is used, the newcomer's recorded."""
        with self._lock:
            spare = self.worker(task, 0, spare_rank)
            batch = Batch(workers=[] if spare is None or spare.state is not WorkerPhase.SPARE else [
                replace(spare, state=WorkerPhase.USED)
            ])  # fmt: skip
            batch.workers.append(
                WorkerRecord(
                    task, generation, rank, node, local, WorkerPhase.LAUNCHING, None, None, None, now, True
                )
            )
            self._commit(batch)

    def lose_node_workers(self, node: str) -> list[WorkerRecord]:
        """A node was lost: its live workers are lost too; returns them as they were."""
        with self._lock:
            lost = self.live_workers_on(node)
            self._commit(Batch(workers=self._ended(lost, WorkerPhase.LOST)))
            return lost

    # ------------------------------------------------------------ what the parts keep
    def kept(self, name: str) -> Any:
        """What was kept under ``name`` (plain JSON data), or None."""
        return self._kept.get(name)

    def keep(self, name: str, value: Any) -> None:
        """Keep ``value`` (plain JSON data) under ``name``, replacing what was kept there."""
        with self._lock:
            self._commit(Batch(kept={name: value}))

    def kept_record(self, kind: type[K], of: str | None = None) -> K | None:
        """The typed record kept under its name (``core/kept.py``; ``of``: the one of that task or
        node), validated; None: none kept."""
        return read_kept(kind, self.kept(kept_name(kind, of)))

    def kept_records(self, kind: type[K], of: Iterable[str]) -> dict[str, K]:
        """The typed records of ``kind`` kept for each of the tasks or nodes ``of`` that has one."""
        found = {name: self.kept_record(kind, of=name) for name in of}
        return {name: record for name, record in found.items() if record is not None}

    def keep_record(self, record: Kept, of: str | None = None) -> None:
        """Keep a typed record under its name, replacing the one kept there."""
        self.keep(kept_name(type(record), of), record.model_dump(mode="json"))

    def drop_record(self, kind: type[Kept], of: str | None = None) -> None:
        """Keep no record of ``kind`` (``of`` that task or node) any more."""
        with self._lock:
            self._commit(Batch(dropped=[kept_name(kind, of)]))

    # ------------------------------------------------------------ the event log
    def event(self, what: str, task: str | None = None, node: str | None = None, **detail: Any) -> int:
        """Record that ``what`` happened, to ``task`` and/or on ``node``; returns the event's id."""
        with self._lock:
            plain = json.loads(json.dumps(detail, default=str))
            record = EventRecord(self._next_event, time.time(), what, task, node, plain)
            if self.journal is None:
                self.backend.write((), [record])
            else:
                self.journal.put((), [record])
            self._next_event += 1
            return record.id

    def sync(self) -> None:
        """Return once every change made so far is durable (before anything leaves the
        coordinator that depends on them: ``journal.py``)."""
        if self.journal is not None:
            self.journal.flush()

    def events(
        self,
        since_id: int = 0,
        task: str | None = None,
        limit: int = 1000,
        kinds: Iterable[str] = (),
        newest: bool = False,
    ) -> list[EventRecord]:
        """Events after ``since_id``, in order: the first ``limit`` (``newest``: the last) of
        ``task``'s, of ``kinds``. A task's events include the plans that changed it (a plan is
        the cluster's event, recorded with no task)."""
        self.sync()  # what this coordinator recorded is read back too
        kinds = frozenset(kinds)
        found = self.backend.events(since_id, task, limit, kinds, newest)
        if task is None or (kinds and PLAN_EVENT not in kinds):
            return found
        plans = self.backend.events(since_id, None, limit, frozenset({PLAN_EVENT}), newest)
        mine = [e for e in plans if task in (e.detail.get("changes") or {})]
        merged = sorted([*found, *mine], key=lambda e: e.id)
        return merged[-limit:] if newest else merged[:limit]

    def close(self) -> None:
        if self.journal is not None:
            self.journal.close()
        with self._lock:
            self.backend.close()

"""The coordinator's durable state in SQLite: nodes, tasks, workers (slots held per generation),
the iterations already counted, and events. With ``schema.py`` (its tables), the only SQL.

Every operation is named for what it does, returns typed records (``records.py``) and commits at
once, so a restarted coordinator loses nothing. State changes are checked against the transition
tables of ``core.states``: an illegal one raises :class:`IllegalTransition` and writes nothing.
"""

from __future__ import annotations

import json
import sqlite3

from unicron.control.eventlog import Database, placeholders
from unicron.control.records import NodeRecord, TaskRecord, WorkerRecord
from unicron.control.snapshot import Snapshot
from unicron.core.errors import Conflict, NotFound
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


class Store(Database):
    def snapshot(self) -> Snapshot:
        """Live tasks, nodes and each live task's current members, in one read."""
        task_marks, task_states = placeholders(LIVE_TASK_STATES)
        worker_marks, phases = placeholders(LIVE_WORKER_PHASES)
        with self._tx() as db:
            tasks = [
                TaskRecord.of(r)
                for r in db.execute(
                    f"SELECT * FROM tasks WHERE state IN ({task_marks}) ORDER BY submitted", task_states
                )
            ]
            nodes = [NodeRecord.of(r) for r in db.execute("SELECT * FROM nodes ORDER BY id")]
            members: dict[str, list[WorkerRecord]] = {t.name: [] for t in tasks}
            for r in db.execute(
                f"SELECT w.* FROM workers w JOIN tasks t ON w.task = t.name AND w.generation = t.generation "
                f"WHERE t.state IN ({task_marks}) AND w.state IN ({worker_marks}) ORDER BY w.rank",
                (*task_states, *phases),
            ):
                members[r["task"]].append(WorkerRecord.of(r))
            highest = {
                r["task"]: int(r["g"] or 0)
                for r in db.execute("SELECT task, MAX(generation) AS g FROM workers GROUP BY task")
            }
        return Snapshot(
            tasks={t.name: t for t in tasks},
            nodes={n.name: n for n in nodes},
            members={name: tuple(ws) for name, ws in members.items()},
            next_generation={t.name: max(t.generation, highest.get(t.name, 0)) + 1 for t in tasks},
        )

    # ------------------------------------------------------------ tasks
    def task(self, name: str) -> TaskRecord | None:
        rows = self._rows("SELECT * FROM tasks WHERE name = ?", name)
        return TaskRecord.of(rows[0]) if rows else None

    def get_task(self, name: str) -> TaskRecord:
        task = self.task(name)
        if task is None:
            raise NotFound(f"no task named {name!r}")
        return task

    def tasks(self, live_only: bool = False) -> list[TaskRecord]:
        if not live_only:
            return [TaskRecord.of(r) for r in self._rows("SELECT * FROM tasks ORDER BY submitted")]
        marks, states = placeholders(LIVE_TASK_STATES)
        rows = self._rows(f"SELECT * FROM tasks WHERE state IN ({marks}) ORDER BY submitted", *states)
        return [TaskRecord.of(r) for r in rows]

    def add_task(self, name: str, spec_json: str, now: float) -> None:
        with self._tx() as db:
            if db.execute("SELECT 1 FROM tasks WHERE name = ?", (name,)).fetchone():
                raise Conflict(f"a task named {name!r} exists; choose another name")
            db.execute(
                "INSERT INTO tasks (name, spec, state, submitted) VALUES (?, ?, ?, ?)",
                (name, spec_json, TaskState.WAITING.value, now),
            )

    def _move_task(self, db: sqlite3.Connection, name: str, to: TaskState) -> sqlite3.Row:
        row = db.execute("SELECT * FROM tasks WHERE name = ?", (name,)).fetchone()
        if row is None:
            raise NotFound(f"no task named {name!r}")
        check(f"task {name}", TASK_TRANSITIONS, TaskState(row["state"]), to)
        return row  # type: ignore[no-any-return]

    def task_launched(self, name: str, generation: int, workers: int, port: int, now: float) -> None:
        """A generation was launched from a checkpoint (the first launch or a restart)."""
        with self._tx() as db:
            self._move_task(db, name, TaskState.STARTING)
            db.execute(
                "UPDATE tasks SET state = ?, generation = ?, launched_generation = ?, workers = ?, "
                "store_port = ?, restarts = restarts + ?, started = COALESCE(started, ?), "
                "redo_until = step WHERE name = ?",
                (
                    TaskState.STARTING.value,
                    generation,
                    generation,
                    workers,
                    port,
                    int(generation > 1),
                    now,
                    name,
                ),
            )

    def task_down(self, name: str, to: TaskState, now: float, reason: str | None = None) -> None:
        """A failure took the task down: it recovers (starting in place, or restarting) or fails."""
        with self._tx() as db:
            row = self._move_task(db, name, to)
            finished = now if to is TaskState.FAILED else None
            db.execute(
                "UPDATE tasks SET state = ?, failures = failures + 1, down_since = COALESCE(down_since, ?), "
                "finished = COALESCE(?, finished), reason = COALESCE(?, reason) WHERE name = ?",
                (to.value, row["down_since"] or now, finished, reason, name),
            )

    def task_stopping(self, name: str, now: float) -> None:
        """The plan stops the task's generation at a step boundary, to relaunch it."""
        with self._tx() as db:
            self._move_task(db, name, TaskState.RESTARTING)
            db.execute(
                "UPDATE tasks SET state = ?, down_since = COALESCE(down_since, ?) WHERE name = ?",
                (TaskState.RESTARTING.value, now, name),
            )

    def task_ended(self, name: str, to: TaskState, now: float, reason: str | None = None) -> None:
        """Finished, cancelled or failed (without a new failure to count)."""
        with self._tx() as db:
            self._move_task(db, name, to)
            db.execute(
                "UPDATE tasks SET state = ?, finished = ?, reason = COALESCE(?, reason) WHERE name = ?",
                (to.value, now, reason, name),
            )

    def task_waiting(self, name: str) -> None:
        """No workers: stopped for a relaunch, or queued with no slots for it."""
        with self._tx() as db:
            self._move_task(db, name, TaskState.WAITING)
            db.execute(
                "UPDATE tasks SET state = ?, workers = 0 WHERE name = ?", (TaskState.WAITING.value, name)
            )

    def task_running(self, name: str, now: float) -> float | None:
        """The generation completed a step; returns the downtime that ended, if any."""
        with self._tx() as db:
            row = self._move_task(db, name, TaskState.RUNNING)
            down = now - row["down_since"] if row["down_since"] is not None else None
            db.execute(
                "UPDATE tasks SET state = ?, downtime_s = downtime_s + ?, down_since = NULL WHERE name = ?",
                (TaskState.RUNNING.value, down or 0.0, name),
            )
            return down

    def task_membership(self, name: str, generation: int, workers: int) -> None:
        """The task's workers now form ``generation`` (in place: nothing restarted)."""
        with self._tx() as db:
            db.execute(
                "UPDATE tasks SET generation = ?, workers = ? WHERE name = ?", (generation, workers, name)
            )

    def task_store_port(self, name: str, port: int) -> None:
        with self._tx() as db:
            db.execute("UPDATE tasks SET store_port = ? WHERE name = ?", (port, name))

    def task_checkpointed(self, name: str, step: int) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE tasks SET checkpoint_step = MAX(checkpoint_step, ?) WHERE name = ?", (step, name)
            )

    def task_done(self, name: str, step: int, digest: str) -> None:
        with self._tx() as db:
            db.execute(
                "UPDATE tasks SET digest = ?, step = MAX(step, ?) WHERE name = ?", (digest, step, name)
            )

    def count_iteration(
        self, name: str, generation: int, rank: int, step: int, samples: int, flop: float
    ) -> bool:
        """Count a rank's completed step once: False (nothing counted) for a report seen before.
        A step trained again after a restart from a checkpoint (up to ``redo_until``) is not
        progress: it adds nothing to the samples and FLOP achieved (the WAF)."""
        with self._tx() as db:
            seen = db.execute(
                "SELECT step FROM counted WHERE task = ? AND generation = ? AND rank = ?",
                (name, generation, rank),
            ).fetchone()
            if seen is not None and seen["step"] >= step:
                return False
            db.execute(
                "INSERT OR REPLACE INTO counted (task, generation, rank, step) VALUES (?, ?, ?, ?)",
                (name, generation, rank, step),
            )
            db.execute(
                "UPDATE tasks SET samples = samples + CASE WHEN ? > redo_until THEN ? ELSE 0 END, "
                "flop = flop + CASE WHEN ? > redo_until THEN ? ELSE 0 END, step = MAX(step, ?) "
                "WHERE name = ?",
                (step, samples, step, flop, step, name),
            )
            return True

    # ------------------------------------------------------------ nodes
    def node(self, name: str) -> NodeRecord | None:
        rows = self._rows("SELECT * FROM nodes WHERE name = ?", name)
        return NodeRecord.of(rows[0]) if rows else None

    def nodes(self) -> list[NodeRecord]:
        return [NodeRecord.of(r) for r in self._rows("SELECT * FROM nodes ORDER BY id")]

    def node_registered(
        self,
        name: str,
        slots: int,
        gpus: list[str],
        host: str,
        state: NodeState,
        now: float,
        probe_port: int = 0,
    ) -> None:
        with self._tx() as db:
            row = db.execute("SELECT state FROM nodes WHERE name = ?", (name,)).fetchone()
            if row is None:
                db.execute(
                    "INSERT INTO nodes (name, slots, gpus, host, state, last_seen, probe_port)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (name, slots, json.dumps(gpus), host, state.value, now, probe_port),
                )
                return
            check(f"node {name}", NODE_TRANSITIONS, NodeState(row["state"]), state)
            db.execute(
                "UPDATE nodes SET slots = ?, gpus = ?, host = ?, state = ?, last_seen = ?, probe_port = ?"
                " WHERE name = ?",
                (slots, json.dumps(gpus), host, state.value, now, probe_port, name),
            )

    def node_seen(self, name: str, now: float) -> None:
        with self._tx() as db:
            db.execute("UPDATE nodes SET last_seen = ? WHERE name = ?", (now, name))

    def remove_node(self, name: str) -> None:
        with self._tx() as db:
            db.execute("DELETE FROM nodes WHERE name = ?", (name,))

    def node_state(self, name: str, to: NodeState) -> None:
        with self._tx() as db:
            row = db.execute("SELECT state FROM nodes WHERE name = ?", (name,)).fetchone()
            if row is None:
                raise NotFound(f"no node named {name!r}")
            check(f"node {name}", NODE_TRANSITIONS, NodeState(row["state"]), to)
            db.execute("UPDATE nodes SET state = ? WHERE name = ?", (to.value, name))

    # ------------------------------------------------------------ workers
    def workers(self, task: str, generation: int | None = None, live: bool = False) -> list[WorkerRecord]:
        sql, args = "SELECT * FROM workers WHERE task = ?", [task]
        if generation is not None:
            sql += " AND generation = ?"
            args.append(str(generation))
        if live:
            marks, states = placeholders(LIVE_WORKER_PHASES)
            sql += f" AND state IN ({marks})"
            args += states
        return [WorkerRecord.of(r) for r in self._rows(sql + " ORDER BY generation, rank", *args)]

    def worker(self, task: str, generation: int, rank: int) -> WorkerRecord | None:
        rows = self._rows(
            "SELECT * FROM workers WHERE task = ? AND generation = ? AND rank = ?", task, generation, rank
        )
        return WorkerRecord.of(rows[0]) if rows else None

    def live_workers_on(self, node: str) -> list[WorkerRecord]:
        marks, states = placeholders(LIVE_WORKER_PHASES)
        rows = self._rows(f"SELECT * FROM workers WHERE node = ? AND state IN ({marks})", node, *states)
        return [WorkerRecord.of(r) for r in rows]

    def held_slots(self) -> dict[str, dict[str, int]]:
        """node -> task -> live workers there."""
        marks, states = placeholders(LIVE_WORKER_PHASES)
        held: dict[str, dict[str, int]] = {}
        for r in self._rows(
            f"SELECT node, task, COUNT(*) AS n FROM workers WHERE state IN ({marks}) GROUP BY node, task",
            *states,
        ):
            held.setdefault(r["node"], {})[r["task"]] = int(r["n"])
        return held

    def max_generation(self, task: str) -> int:
        rows = self._rows("SELECT MAX(generation) AS g FROM workers WHERE task = ?", task)
        return int(rows[0]["g"] or 0)

    def max_rank(self, task: str, generation: int) -> int | None:
        rows = self._rows(
            "SELECT MAX(rank) AS r FROM workers WHERE task = ? AND generation = ?", task, generation
        )
        return None if rows[0]["r"] is None else int(rows[0]["r"])

    def add_workers(
        self,
        task: str,
        generation: int,
        placement: dict[str, int],
        first_rank: int,
        phase: WorkerPhase,
        now: float,
    ) -> list[WorkerRecord]:
        """Record workers for ``placement`` (node -> count), ranks from ``first_rank`` on, each on
        a local slot (device) that no worker or spare of any task holds on its node."""
        added: list[WorkerRecord] = []
        marks, holding = placeholders(SLOT_HOLDING_PHASES)
        with self._tx() as db:
            rank = first_rank
            for node, count in placement.items():
                taken = {
                    int(r["local_rank"])
                    for r in db.execute(
                        f"SELECT local_rank FROM workers WHERE node = ? AND state IN ({marks})",
                        (node, *holding),
                    ).fetchall()
                }
                for local in [i for i in range(len(taken) + count) if i not in taken][:count]:
                    db.execute(
                        "INSERT OR REPLACE INTO workers (task, generation, rank, node, local_rank, state, "
                        "launched) VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (task, generation, rank, node, local, phase.value, now),
                    )
                    added.append(
                        WorkerRecord(task, generation, rank, node, local, phase, None, None, None, now)
                    )
                    rank += 1
        return added

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
        with self._tx() as db:
            row = db.execute(
                "SELECT state FROM workers WHERE task = ? AND generation = ? AND rank = ?", key
            ).fetchone()
            if row is None:
                return False
            before = WorkerPhase(row["state"])
            if before != to and not WORKER_TRANSITIONS[before]:
                return False  # ended already: the first verdict stands
            check(f"worker {key}", WORKER_TRANSITIONS, before, to)
            db.execute(
                "UPDATE workers SET state = ?, pid = COALESCE(?, pid), exit_code = COALESCE(?, exit_code), "
                "exit_signal = COALESCE(?, exit_signal) WHERE task = ? AND generation = ? AND rank = ?",
                (to.value, pid, code, signal, *key),
            )
            return True

    def end_workers(self, task: str, generation: int, to: WorkerPhase) -> None:
        """Every live worker of a generation becomes ``to`` (stopped, or moved to the next one)."""
        marks, states = placeholders(s for s in sources(WORKER_TRANSITIONS, to) if WorkerPhase(s).live)
        with self._tx() as db:
            db.execute(
                f"UPDATE workers SET state = ? WHERE task = ? AND generation = ? AND state IN ({marks})",
                (to.value, task, generation, *states),
            )

    def switch_generation(
        self, task: str, old: int, new: int, kept: dict[WorkerRecord, int], now: float
    ) -> None:
        """Survivors ``kept`` (record -> new rank) form generation ``new``: their rows of ``old``
        become moved, each gets a running row in ``new``, and the task follows, in one commit."""
        marks, states = placeholders(LIVE_WORKER_PHASES)
        with self._tx() as db:
            db.execute(
                f"UPDATE workers SET state = ? WHERE task = ? AND generation = ? AND state IN ({marks})",
                (WorkerPhase.MOVED.value, task, old, *states),
            )
            for w, rank in kept.items():
                db.execute(
                    "INSERT OR REPLACE INTO workers (task, generation, rank, node, local_rank, state, pid, "
                    "launched) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (task, new, rank, w.node, w.local_rank, WorkerPhase.RUNNING.value, w.pid, now),
                )
            db.execute("UPDATE tasks SET generation = ?, workers = ? WHERE name = ?", (new, len(kept), task))

    def spare_used(
        self, task: str, spare_rank: int, generation: int, rank: int, node: str, local: int, now: float
    ) -> None:
        """A hot spare takes a newcomer's identity: its spare row is used, the newcomer's recorded."""
        with self._tx() as db:
            db.execute(
                "UPDATE workers SET state = ? WHERE task = ? AND generation = 0 AND rank = ? AND state = ?",
                (WorkerPhase.USED.value, task, spare_rank, WorkerPhase.SPARE.value),
            )
            db.execute(
                "INSERT OR REPLACE INTO workers (task, generation, rank, node, local_rank, state, "
                "launched) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (task, generation, rank, node, local, WorkerPhase.LAUNCHING.value, now),
            )

    def lose_node_workers(self, node: str) -> list[WorkerRecord]:
        """A node was lost: its live workers are lost too; returns them as they were."""
        lost = self.live_workers_on(node)
        marks, states = placeholders(LIVE_WORKER_PHASES)
        with self._tx() as db:
            db.execute(
                f"UPDATE workers SET state = ? WHERE node = ? AND state IN ({marks})",
                (WorkerPhase.LOST.value, node, *states),
            )
        return lost

    def close(self) -> None:
        with self._lock:
            self._db.close()

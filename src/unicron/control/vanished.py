"""Slots held in the store by processes that no longer run: the rows of ended tasks.

A row in a slot-holding phase (launching, running, spare) keeps its slot until the process's exit
is recorded (``slots.py``). An exit can go unrecorded: a heartbeat's answer does not wait for its
reports to be durable (``journal.py``), so a coordinator killed just after answering loses them,
and the agent, having delivered them, does not send them again; a spare of a task that ended just
before a restart is not among the spares a successor restores (``Placer.rebuild_spares``), so its
exit is not matched to it. A task that runs has its own guards (launch timeouts, hang detection);
an ended task has none, and its rows would hold their slots for good: a plan that gives them to
another task waits for them for ever.

Each agent lists every process it has on each heartbeat (running or exited). A row of an ended
task whose node's latest list, received after the task ended, does not show its process running
has lost its process: the row is ended. A process is matched by its identity or by its pid (a
survivor renamed in place is listed under its former identity until its agent catches up). A
row whose process was never seen (no pid) is given ``launch_timeout_s`` to start first: the
agent may not have carried its launch order out yet.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from unicron.control.context import Context
from unicron.control.records import TaskRecord, WorkerRecord
from unicron.core.protocol import WorkerState
from unicron.core.states import SLOT_HOLDING_PHASES, WorkerPhase

WorkerKey = tuple[str, int, int]


@dataclass(frozen=True)
class Listing:
    """What a node's agent last said it runs, and when that was received."""

    at: float
    running: frozenset[WorkerKey]
    pids: frozenset[int]

    @staticmethod
    def of(reported: Iterable[WorkerState], at: float) -> Listing:
        alive = [w for w in reported if w.running]
        return Listing(
            at, frozenset((w.task, w.generation, w.rank) for w in alive), frozenset(w.pid for w in alive)
        )

    def shows(self, row: WorkerRecord) -> bool:
        return row.key in self.running or (row.pid is not None and row.pid in self.pids)


def gone(
    rows: Sequence[WorkerRecord],
    tasks: Mapping[str, TaskRecord | None],
    listings: Mapping[str, Listing],
    now: float,
    launch_timeout_s: float,
) -> list[WorkerRecord]:
    """The ``rows`` (holding slots) of ended tasks whose processes no longer run; pure."""
    found: list[WorkerRecord] = []
    for row in rows:
        task, listing = tasks.get(row.task), listings.get(row.node)
        if task is not None and task.state.live:
            continue  # a running task's own guards judge its workers
        ended_at = (task.finished or 0.0) if task is not None else 0.0
        if listing is None or listing.at <= ended_at:
            continue  # nothing heard from its node since the task ended
        if listing.shows(row):
            continue
        if row.pid is None and now - row.launched < launch_timeout_s:
            continue  # its launch order may not have been carried out yet
        found.append(row)
    return found


@dataclass
class Vanished:
    """The agents' latest lists, and the rows of ended tasks ended by them (once a heartbeat
    interval: a list comes no more often, and the pass reads every slot-holding row)."""

    ctx: Context
    listings: dict[str, Listing] = field(default_factory=dict)
    swept: float = 0.0

    def listed(self, node: str, reported: Iterable[WorkerState], now: float) -> None:
        self.listings[node] = Listing.of(reported, now)

    def sweep(self, now: float) -> bool:
        """End the rows whose processes are gone; True when a slot was freed."""
        limits = self.ctx.limits
        if now - self.swept < limits.heartbeat_interval_s:
            return False
        self.swept = now
        rows = self.ctx.store.workers_in(SLOT_HOLDING_PHASES)
        tasks = {name: self.ctx.store.task(name) for name in {w.task for w in rows}}
        found = gone(rows, tasks, self.listings, now, limits.launch_timeout_s)
        for row in found:
            self.ctx.act.worker_phase(row.key, WorkerPhase.STOPPED)
            self.ctx.act.record(
                "worker_gone",
                task=row.task,
                node=row.node,
                generation=row.generation,
                rank=row.rank,
                was=row.state.value,
                why="its task has ended and its node's agent no longer runs it",
            )
        return bool(found)

"""Checkpoint storage that refuses checkpoints while the task trains on from memory.

A worker whose checkpoint tier fails (full, read-only, gone) keeps training and says so with a
``StorageReport`` (``train/persisting.py``). That is an incident of its own: the storage's
(blaming no node), of the kind ``storage_error``, handled by continuing from memory rather than
by any restart. It closes when the tier takes a checkpoint again (the worker's report, or rank
0's next persisted checkpoint, whoever rank 0 is by then) with how long nothing was persisted.
Open incidents are kept in the store (``core/kept.py:StorageIncidents``), so that one opened
before a coordinator restart is closed after it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from unicron.brain.records import TaskRecord
from unicron.brain.response import TASK_ENDED
from unicron.control.context import Context
from unicron.core.kept import StorageIncident, StorageIncidents
from unicron.core.protocol import StorageReport
from unicron.core.taxonomy import TAXONOMY, ErrorKind, Scope

CONTINUE_FROM_MEMORY = "continue_from_memory"
PERSISTENT = "persistent"


@dataclass(frozen=True)
class Opened:
    """An open storage incident: its event id and when the tier started refusing."""

    incident: int
    since: float


@dataclass
class StorageWatch:
    ctx: Context
    open: dict[tuple[str, str], Opened] = field(default_factory=dict)

    def kept(self) -> StorageIncidents:
        return StorageIncidents(
            open=[
                StorageIncident(task=task, tier=tier, incident=o.incident, since=o.since)
                for (task, tier), o in sorted(self.open.items())
            ]
        )

    def restore(self, kept: StorageIncidents) -> None:
        """The predecessor's open incidents; those of tasks that ended meanwhile end."""
        self.open = {(i.task, i.tier): Opened(i.incident, i.since) for i in kept.open}
        for name in {task for task, _ in self.open}:
            task = self.ctx.store.task(name)
            if task is None or not task.state.live:
                self.forget(name)  # it ended while no coordinator ran

    def report(self, task: TaskRecord, report: StorageReport, node: str) -> None:
        """A tier of ``task``'s checkpoints started refusing them, or took one again."""
        key = (task.name, report.tier)
        if report.ok:
            self._close(key, report.step)
        elif key not in self.open:
            self._open(task, report, node)

    def failing(self, name: str) -> bool:
        """Whether the task's checkpoint storage has an open incident."""
        return any(task == name for task, _ in self.open)

    def persisted(self, name: str, step: int) -> None:
        """Rank 0 reported a persisted checkpoint: the persistent tier takes them again."""
        self._close((name, PERSISTENT), step)

    def forget(self, name: str) -> None:
        """The task ended: its open storage incidents end with it."""
        task = self.ctx.store.task(name)
        for key in [k for k in self.open if k[0] == name]:
            opened = self.open.pop(key)
            self.ctx.act.keep(self.kept())
            state = task.state.value if task is not None else "gone"
            self.ctx.act.record(
                "outcome",
                task=name,
                incident=opened.incident,
                outcome=TASK_ENDED,
                task_state=state,
                action=CONTINUE_FROM_MEMORY,
                actions=[CONTINUE_FROM_MEMORY],
            )

    def _open(self, task: TaskRecord, report: StorageReport, node: str) -> None:
        now, info = self.ctx.clock(), TAXONOMY[ErrorKind.STORAGE_ERROR]
        incident = self.ctx.act.record(
            "incident",
            task=task.name,
            node=node,
            kind=ErrorKind.STORAGE_ERROR.value,
            severity=info.severity.name,
            action=CONTINUE_FROM_MEMORY,
            scope=Scope.STORAGE.value,
            why=f"the {report.tier} checkpoint tier refused step {report.step}: {report.error[:300]}",
            ladder="storage fault: no node blamed; training goes on from the state in memory",
            tier=report.tier,
            failing_since=report.time or now,
            detected_at=now,
            detection_s=round(max(0.0, now - report.time), 4) if report.time else None,
            generation=task.generation,
            step=report.step,
            checkpoint_step=task.checkpoint_step,
        )
        self.open[(task.name, report.tier)] = Opened(incident, report.time or now)
        self.ctx.act.keep(self.kept())

    def _close(self, key: tuple[str, str], step: int) -> None:
        opened = self.open.pop(key, None)
        if opened is None:
            return
        self.ctx.act.keep(self.kept())
        self.ctx.act.record(
            "outcome",
            task=key[0],
            incident=opened.incident,
            outcome="recovered",
            downtime_s=0.0,  # training never stopped
            unpersisted_s=round(max(0.0, self.ctx.clock() - opened.since), 3),
            resumed_step=step,
            action=CONTINUE_FROM_MEMORY,
            actions=[CONTINUE_FROM_MEMORY],
        )

"""Checkpoint storage that refuses checkpoints while the task trains on from memory.

A worker whose checkpoint tier fails (full, read-only, gone) keeps training and says so with a
``StorageReport`` (``train/persisting.py``). That is an incident of its own: the storage's
(blaming no node), of the kind ``storage_error``, handled by continuing from memory rather than
by any restart. It closes when the tier takes a checkpoint again (the worker's report, or rank
0's next persisted checkpoint, whoever rank 0 is by then) with how long nothing was persisted.
Open incidents are rebuilt from the event log when the coordinator restarts, so that one opened
before the restart is closed after it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from unicron.control.context import Context
from unicron.control.recover.response import TASK_ENDED
from unicron.control.store.records import EventRecord, TaskRecord
from unicron.core.protocol import StorageReport
from unicron.core.taxonomy import TAXONOMY, ErrorKind, Scope

CONTINUE_FROM_MEMORY = "continue_from_memory"
PERSISTENT = "persistent"


@dataclass(frozen=True)
class Opened:
    """An open storage incident: its event id and when the tier started refusing."""

    incident: int
    since: float


def open_incidents(events: list[EventRecord]) -> dict[tuple[str, str], Opened]:
    """The storage incidents in ``events`` that no outcome closed yet, by (task, tier)."""
    closed = {e.detail.get("incident") for e in events if e.kind == "outcome"}
    return {
        (e.task or "", str(e.detail.get("tier", PERSISTENT))): Opened(e.id, float(e.detail["failing_since"]))
        for e in events
        if e.kind == "incident" and e.detail.get("action") == CONTINUE_FROM_MEMORY and e.id not in closed
    }


@dataclass
class StorageWatch:
    ctx: Context
    open: dict[tuple[str, str], Opened] = field(default_factory=dict)

    def rebuild(self) -> None:
        """The open incidents, from the event log (after a restart); those of ended tasks end."""
        for task in self.ctx.store.tasks():
            self.open.update(open_incidents(self.ctx.store.events(task=task.name, limit=1_000_000)))
            if not task.state.live:
                self.forget(task.name)  # it ended while no coordinator ran

    def report(self, task: TaskRecord, report: StorageReport, node: str) -> None:
        """A tier of ``task``'s checkpoints started refusing them, or took one again."""
        key = (task.name, report.tier)
        if report.ok:
            self._close(key, report.step)
        elif key not in self.open:
            self._open(task, report, node)

    def persisted(self, name: str, step: int) -> None:
        """Rank 0 reported a persisted checkpoint: the persistent tier takes them again."""
        self._close((name, PERSISTENT), step)

    def forget(self, name: str) -> None:
        """The task ended: its open storage incidents end with it."""
        task = self.ctx.store.task(name)
        for key in [k for k in self.open if k[0] == name]:
            opened = self.open.pop(key)
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

    def _close(self, key: tuple[str, str], step: int) -> None:
        opened = self.open.pop(key, None)
        if opened is None:
            return
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

"""What the store needs from where it keeps its state: the same typed operations run over
SQLite (embedded, the default) or etcd (several coordinators, one leader).

The store (``store.py``) holds the state in memory and decides every change there; a backend
only loads the rows once and writes each change's rows atomically. So both backends run the
same decisions, and the contract suite (``tests/test_store.py``) runs against both.

A write that a backend refuses because this coordinator no longer leads raises
:class:`Fenced`: nothing was written, and the caller must step down. ``location.py`` picks the
backend a store location names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

from unicron.brain.records import EventRecord, NodeRecord, TaskRecord, WorkerRecord

WorkerKey = tuple[str, int, int]  # task, generation, rank


class Table(Enum):
    TASKS = "tasks"
    NODES = "nodes"
    WORKERS = "workers"
    COUNTED = "counted"  # the last step of each rank already counted: a resent report counts once
    KEPT = "kept"  # what the coordinator's parts keep across a restart (the ladder, measured rates)


@dataclass(frozen=True)
class Put:
    """Write ``values`` (a whole row) under ``key`` in ``table``."""

    table: Table
    key: tuple[str | int, ...]
    values: dict[str, Any]


@dataclass(frozen=True)
class Delete:
    table: Table
    key: tuple[str | int, ...]


Change = Put | Delete


@dataclass
class Loaded:
    """Everything a backend holds but the event log, as read when the store opens."""

    tasks: list[TaskRecord] = field(default_factory=list)
    nodes: list[NodeRecord] = field(default_factory=list)
    workers: list[WorkerRecord] = field(default_factory=list)
    counted: dict[WorkerKey, int] = field(default_factory=dict)
    kept: dict[str, Any] = field(default_factory=dict)
    last_event_id: int = 0  # the event log's newest id: the store numbers the next ones itself


class Fenced(RuntimeError):
    """This coordinator lost the leadership: the write was refused, and it must stop."""


class Backend(Protocol):
    def load(self) -> Loaded: ...

    def write(self, changes: Sequence[Change], events: Sequence[EventRecord] = ()) -> None:
        """All of ``changes`` and ``events`` or none of them. An event's id is never written
        twice: one that exists raises :class:`FileExistsError` (another writer numbers events
        in this store), and nothing is written."""

    def events(
        self, since_id: int, task: str | None, limit: int, kinds: frozenset[str], newest: bool
    ) -> list[EventRecord]: ...

    def close(self) -> None: ...

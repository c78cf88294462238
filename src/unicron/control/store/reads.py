"""The read-only face of the store: all that the coordinator's parts other than the applier hold.

Deciders take a snapshot (``brain/snapshot.py``) and ``now`` and return effects; they cannot
write, because the parts of the coordinator hold the store only as :class:`StoreReads` (mypy
rejects a write through it). The applier (``act/effects.py``) holds the store itself.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from unicron.brain.records import EventRecord, NodeRecord, TaskRecord, WorkerRecord
from unicron.brain.snapshot import Snapshot
from unicron.core.kept import K
from unicron.core.states import WorkerPhase


class StoreReads(Protocol):
    """The store's read operations: all that the coordinator's parts other than the applier may use."""

    def snapshot(self, only: str | None = None) -> Snapshot: ...

    def events(
        self,
        since_id: int = 0,
        task: str | None = None,
        limit: int = 1000,
        kinds: Iterable[str] = (),
        newest: bool = False,
    ) -> list[EventRecord]: ...

    def task(self, name: str) -> TaskRecord | None: ...

    def get_task(self, name: str) -> TaskRecord: ...

    def tasks(self, live_only: bool = False) -> list[TaskRecord]: ...

    def node(self, name: str) -> NodeRecord | None: ...

    def nodes(self) -> list[NodeRecord]: ...

    def another_node(self, name: str) -> NodeRecord | None: ...

    def workers(self, task: str, generation: int | None = None, live: bool = False) -> list[WorkerRecord]: ...

    def launching(self, task: str, generation: int) -> tuple[WorkerRecord, ...]: ...

    def worker(self, task: str, generation: int, rank: int) -> WorkerRecord | None: ...

    def live_workers_on(self, node: str) -> list[WorkerRecord]: ...

    def holding_on(self, node: str) -> list[WorkerRecord]: ...

    def workers_in(self, phases: Iterable[WorkerPhase]) -> list[WorkerRecord]: ...

    def held_slots(self) -> dict[str, dict[str, int]]: ...

    def slots_in_use(self) -> dict[str, int]: ...

    def max_generation(self, task: str) -> int: ...

    def max_rank(self, task: str, generation: int) -> int | None: ...

    def kept_record(self, kind: type[K], of: str | None = None) -> K | None: ...

    def kept_records(self, kind: type[K], of: Iterable[str]) -> dict[str, K]: ...

"""One store operation's changes: the records it writes together, made into the backend's rows
only when read (``Store._commit`` queues them in the journal as they are, so the writer's thread
makes the rows, not the coordinator's loop)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

from unicron.brain.records import NodeRecord, TaskRecord, WorkerRecord, row
from unicron.control.store.backend import Change, Delete, Put, Table, WorkerKey


@dataclass
class Batch(Sequence[Change]):
    """The records one operation changes, written together: as the backend's changes, made
    into rows only when read. Queued in the journal as it is, they are made by the writer's
    thread, not on the loop (a generation's switch is two rows per worker, hundreds in a large
    task). Not changed once committed (its records are frozen)."""

    tasks: list[TaskRecord] = field(default_factory=list)
    nodes: list[NodeRecord] = field(default_factory=list)
    workers: list[WorkerRecord] = field(default_factory=list)
    counted: dict[WorkerKey, int] = field(default_factory=dict)
    kept: dict[str, Any] = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)  # kept entries that go
    removed_nodes: list[str] = field(default_factory=list)
    _made: list[Change] | None = field(default=None, init=False, repr=False, compare=False)

    def __len__(self) -> int:
        rows = len(self.tasks) + len(self.nodes) + len(self.workers) + len(self.counted) + len(self.kept)
        return rows + len(self.dropped) + len(self.removed_nodes)

    @overload
    def __getitem__(self, index: int) -> Change: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Change]: ...

    def __getitem__(self, index: int | slice) -> Change | Sequence[Change]:
        return self.changes()[index]

    def __iter__(self) -> Iterator[Change]:
        return iter(self.changes())

    def changes(self) -> list[Change]:
        if self._made is None:
            self._made = self._rows()
        return self._made

    def _rows(self) -> list[Change]:
        out: list[Change] = [Put(Table.TASKS, (t.name,), row(t)) for t in self.tasks]
        out += [Put(Table.NODES, (n.name,), row(n)) for n in self.nodes]
        out += [Put(Table.WORKERS, w.key, row(w)) for w in self.workers]
        out += [
            Put(Table.COUNTED, key, {"task": key[0], "generation": key[1], "rank": key[2], "step": step})
            for key, step in self.counted.items()
        ]
        out += [Put(Table.KEPT, (name,), {"name": name, "value": value}) for name, value in self.kept.items()]
        out += [Delete(Table.KEPT, (name,)) for name in self.dropped]
        return out + [Delete(Table.NODES, (name,)) for name in self.removed_nodes]

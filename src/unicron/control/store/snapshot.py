"""What the deciders see: a typed, frozen view of the cluster at one instant, and the read-only
face of the store.

Deciders (``recovery.respond``, ``generations.survivors``, ...) take a :class:`Snapshot` and
``now`` and return effects; they cannot write, because the parts of the coordinator hold the
store only as :class:`StoreReads` (mypy rejects a write through it). The applier
(``effects.py``) holds the store itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol

from unicron.control.store.records import EventRecord, NodeRecord, TaskRecord, WorkerRecord
from unicron.core.errors import NotFound
from unicron.core.kept import K
from unicron.core.states import NodeState, WorkerPhase


@dataclass(frozen=True)
class Snapshot:
    """Live tasks, every node, and the live members of each live task's current generation,
    read in one transaction (so they agree with each other)."""

    tasks: Mapping[str, TaskRecord]
    nodes: Mapping[str, NodeRecord]
    members: Mapping[str, tuple[WorkerRecord, ...]]  # task -> live workers of its generation
    next_generation: Mapping[str, int]  # task -> a generation number it never used
    # node -> until when its isolation runs (also while it is lost: it comes back isolated)
    isolated_until: Mapping[str, float] = field(default_factory=dict)
    # The healthy nodes' names: set by the store, which keeps them between node changes; else
    # (a snapshot built or replaced by hand) found from ``nodes`` when first asked.
    healthy_names: frozenset[str] | None = field(default=None, init=False, repr=False, compare=False)

    def task(self, name: str) -> TaskRecord:
        if name not in self.tasks:
            raise NotFound(f"no live task named {name!r}")
        return self.tasks[name]

    def live(self, name: str) -> tuple[WorkerRecord, ...]:
        return self.members.get(name, ())

    def healthy(self) -> frozenset[str]:
        """The healthy nodes, read once (deciders ask many times a decision; at 2,048 nodes
        a read is a millisecond)."""
        if self.healthy_names is None:
            healthy = frozenset(n.name for n in self.nodes.values() if n.state is NodeState.HEALTHY)
            object.__setattr__(self, "healthy_names", healthy)
            return healthy
        return self.healthy_names

    def with_isolations(self, isolated_until: Mapping[str, float]) -> Snapshot:
        """The same read with the isolations recovery keeps; the healthy names go with it (the
        nodes are the same; ``dataclasses.replace`` alone would drop them, and every decision
        on the copy found them again from every node)."""
        copy = replace(self, isolated_until=isolated_until)
        object.__setattr__(copy, "healthy_names", self.healthy_names)
        return copy

    def node_state(self, name: str) -> NodeState | None:
        node = self.nodes.get(name)
        return None if node is None else node.state


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

    def worker(self, task: str, generation: int, rank: int) -> WorkerRecord | None: ...

    def live_workers_on(self, node: str) -> list[WorkerRecord]: ...

    def holding_on(self, node: str) -> list[WorkerRecord]: ...

    def workers_in(self, phases: Iterable[WorkerPhase]) -> list[WorkerRecord]: ...

    def held_slots(self) -> dict[str, dict[str, int]]: ...

    def slots_in_use(self) -> dict[str, int]: ...

    def max_generation(self, task: str) -> int: ...

    def max_rank(self, task: str, generation: int) -> int | None: ...

    def kept_record(self, kind: type[K], of: str | None = None) -> K | None: ...

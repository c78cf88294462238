"""What the deciders see: a typed, frozen view of the cluster at one instant.

Deciders (``brain/response.py:respond``, ``brain/membership.py:survivors``, ...) take a
:class:`Snapshot` and ``now`` and return effects (``brain/effects.py``); the coordinator reads one
from its store (``control/store/reads.py``), the simulator builds one of its simulated cluster.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from unicron.brain.records import NodeRecord, TaskRecord, WorkerRecord
from unicron.core.errors import NotFound
from unicron.core.states import NodeState


@dataclass(frozen=True)
class Snapshot:
    """Live tasks, every node, and the live members of each live task's current generation,
    read in one transaction (so they agree with each other)."""

    tasks: Mapping[str, TaskRecord]
    nodes: Mapping[str, NodeRecord]
    members: Mapping[str, tuple[WorkerRecord, ...]]  # task -> live workers of its generation
    next_generation: Mapping[str, int]  # task -> a generation number it never used
    # node -> until when its isolation runs (also while it is lost: it comes back isolated)
    isolated_until: Mapping[str, float | None] = field(default_factory=dict)  # None: until resumed
    # task -> (its members, how many of them on each node): given by the store, which counts them
    # as it reads them (the same mapping until one of them changes); used while the members are
    # those it was counted from (a copy given other members counts them when asked).
    spreads: Mapping[str, tuple[tuple[WorkerRecord, ...], Mapping[str, int]]] = field(
        default_factory=dict, repr=False, compare=False
    )
    # The healthy nodes' names: set by the store, which keeps them between node changes; else
    # (a snapshot built or replaced by hand) found from ``nodes`` when first asked.
    healthy_names: frozenset[str] | None = field(default=None, init=False, repr=False, compare=False)

    def task(self, name: str) -> TaskRecord:
        if name not in self.tasks:
            raise NotFound(f"no live task named {name!r}")
        return self.tasks[name]

    def live(self, name: str) -> tuple[WorkerRecord, ...]:
        return self.members.get(name, ())

    def spread(self, name: str) -> Mapping[str, int]:
        """How many of the task's members are on each node."""
        given, members = self.spreads.get(name), self.live(name)
        return given[1] if given is not None and given[0] is members else Counter(w.node for w in members)

    def healthy(self) -> frozenset[str]:
        """The healthy nodes, read once (deciders ask many times a decision; at 2,048 nodes
        a read is a millisecond)."""
        if self.healthy_names is None:
            healthy = frozenset(n.name for n in self.nodes.values() if n.state is NodeState.HEALTHY)
            object.__setattr__(self, "healthy_names", healthy)
            return healthy
        return self.healthy_names

    def with_isolations(self, isolated_until: Mapping[str, float | None]) -> Snapshot:
        """The same read with the isolations recovery keeps; the healthy names go with it (the
        nodes are the same; ``dataclasses.replace`` alone would drop them, and every decision
        on the copy found them again from every node)."""
        copy = replace(self, isolated_until=isolated_until)
        object.__setattr__(copy, "healthy_names", self.healthy_names)
        return copy

    def node_state(self, name: str) -> NodeState | None:
        node = self.nodes.get(name)
        return None if node is None else node.state

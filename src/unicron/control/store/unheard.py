"""The nodes by when they were last heard: which are unheard since a time, without reading them all.

The coordinator looks for silent nodes several times a heartbeat interval; at 2,048 nodes,
reading every node each time was a millisecond or more of the loop, for the few (usually none)
that are silent. Each time a node is heard, its time goes on a heap; a look pops the times older
than what it asks about, and a node whose newest time was popped is unheard since then, until it
is heard again. Not thread-safe (the store's lock guards it).
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping

from unicron.brain.records import NodeRecord

# The heap keeps one entry per heartbeat until a look pops it; past this many entries a node (a
# store that nobody asks, a long pause between looks), it is made again from the nodes' newest.
ENTRIES_PER_NODE = 8


class Unheard:
    def __init__(self, nodes: Mapping[str, NodeRecord]) -> None:
        self._heap: list[tuple[float, str]] = []
        self._quiet: set[str] = set()  # nodes whose newest time was popped: unheard since it
        self.rebuild(nodes)

    def heard(self, name: str, at: float, nodes: Mapping[str, NodeRecord]) -> None:
        """``name`` was heard at ``at`` (its record in ``nodes`` says so already)."""
        heapq.heappush(self._heap, (at, name))
        self._quiet.discard(name)
        if len(self._heap) > ENTRIES_PER_NODE * len(nodes) + 1024:
            self.rebuild(nodes)

    def forget(self, name: str) -> None:
        """``name`` was removed (its entries on the heap are passed over when popped)."""
        self._quiet.discard(name)

    def rebuild(self, nodes: Mapping[str, NodeRecord]) -> None:
        self._heap = [(n.last_seen, name) for name, n in nodes.items() if name not in self._quiet]
        heapq.heapify(self._heap)

    def since(self, cutoff: float, nodes: Mapping[str, NodeRecord]) -> list[NodeRecord]:
        """The nodes last heard before ``cutoff``, by id."""
        heap, quiet = self._heap, self._quiet
        while heap and heap[0][0] < cutoff:
            at, name = heapq.heappop(heap)
            node = nodes.get(name)
            if node is not None and node.last_seen == at:  # (else heard since, or removed)
                quiet.add(name)
        found = [node for name in quiet if (node := nodes.get(name)) is not None and node.last_seen < cutoff]
        return sorted(found, key=lambda n: n.id)

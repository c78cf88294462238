"""Placement: which nodes a plan's workers go to, moving as few as possible.

Given worker counts per task and the previous assignment, keep every worker that may stay,
remove surplus workers from the nodes where a task has the fewest (freeing whole nodes), and put
new workers first beside the task's own, then on whole free nodes, then wherever most is free.

A task of sharded replicas (``replica_sizes``) gets whole replicas on a node: its count on each
node is a multiple of its replica size, or of the node size where a replica spans nodes. Where
the free slots are too scattered for that, the whole cluster is packed afresh, largest units
first.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from operator import is_

Assignment = dict[int, dict[str, int]]


def pack(
    counts: Mapping[str, int],
    nodes: Sequence[int],
    gpus_per_node: int,
    replica_sizes: Mapping[str, int] | None = None,
) -> Assignment:
    """A fresh placement with nothing to preserve."""
    return place(counts, nodes, gpus_per_node, {}, replica_sizes)


def node_unit(replica_size: int, gpus_per_node: int) -> int:
    """Workers of a task that go to a node together: a whole replica where one fits on a node
    (the replica size divides the node size), else whole nodes (a replica spans several)."""
    return replica_size if replica_size <= gpus_per_node else gpus_per_node


def place(
    counts: Mapping[str, int],
    nodes: Sequence[int],
    gpus_per_node: int,
    previous: Mapping[int, Mapping[str, int]],
    replica_sizes: Mapping[str, int] | None = None,
) -> Assignment:
    need_total = sum(counts.values())
    if need_total > len(nodes) * gpus_per_node:
        raise ValueError(f"{need_total} GPUs asked for, {len(nodes) * gpus_per_node} available")
    units = {t: node_unit((replica_sizes or {}).get(t, 1), gpus_per_node) for t in counts}
    try:
        return _place(counts, nodes, gpus_per_node, previous, units)
    except _Scattered:
        if previous:  # keeping workers where they are left the slots too scattered
            return _place(counts, nodes, gpus_per_node, {}, units)
        raise ValueError(
            f"cannot place whole replicas ({dict(units)} per node) of {dict(counts)} on {len(nodes)} "
            f"nodes of {gpus_per_node}"
        ) from None


class _Scattered(Exception):
    """The free slots are too scattered for whole replicas."""


class _Layout:
    """A placement being built: who is where, with running totals (a task's workers placed and
    on which nodes, a node's slots used, the nodes empty and full) kept as workers are taken off
    and put on. Only nodes holding workers are written: at 2,048 nodes, reading every node for
    every task (its own, the free ones) was most of a placement's time, and a placement is made
    at every plan the coordinator carries out and at every event the simulator replays."""

    def __init__(
        self,
        nodes: Sequence[int],
        gpus_per_node: int,
        previous: Mapping[int, Mapping[str, int]],
        kept: _Kept,
    ) -> None:
        """Starts from the workers of ``previous`` that stay (``kept``: how a node's row stays;
        nodes out of service dropped), its totals counted in the same pass: at 2,048 nodes, one
        pass over them per total was most of a simulated event's placement."""
        self.nodes, self.size, self.in_service = nodes, gpus_per_node, set(nodes)
        self.result: Assignment = {}  # node -> task -> workers (nodes that held some)
        self.used: dict[int, int] = {}  # node -> slots used
        self.full: set[int] = set()  # no free slot
        self.totals: dict[str, int] = {}  # task -> workers placed
        self.where: dict[str, dict[int, int]] = {}  # task -> node -> workers (the same counts)
        in_service, result, used, full, totals, where = (
            self.in_service,
            self.result,
            self.used,
            self.full,
            self.totals,
            self.where,
        )
        single = kept.single
        for n, held in previous.items():  # (nodes out of service are no longer in ``nodes``)
            if n not in in_service or not held:
                continue
            if held.keys() <= single and min(held.values()) > 0:
                row = dict(held)  # (the usual case, inline: a call per node was a sixth of it)
            elif not (row := kept.row(held)):
                continue
            result[n] = row
            used[n] = slots = sum(row.values())
            if slots >= gpus_per_node:
                full.add(n)
            for t, g in row.items():
                totals[t] = totals.get(t, 0) + g
                on = where.get(t)
                if on is None:
                    on = where[t] = {}
                on[n] = g
        self.empty = in_service.difference(result)  # no worker
        self._order: dict[int, int] | None = None  # node -> its place in ``nodes``, once asked
        self._empties: list[tuple[int, int]] | None = None  # (place, node) of nodes once empty

    def placed(self, task: str) -> int:
        return self.totals.get(task, 0)

    def on(self, task: str) -> dict[int, int]:
        """Where ``task`` has workers (node -> how many)."""
        return self.where.setdefault(task, {})

    def free(self, node: int) -> int:
        return self.size - self.used.get(node, 0)

    def put(self, node: int, task: str, gpus: int) -> int:
        """Put up to ``gpus`` more of ``task`` on ``node``; how many were put."""
        gpus = max(gpus, 0)
        if gpus:
            on = self.result.setdefault(node, {})
            on[task] = on.get(task, 0) + gpus
            self.on(task)[node] = on[task]
            self.totals[task] = self.totals.get(task, 0) + gpus
            self.used[node] = self.used.get(node, 0) + gpus
            self.empty.discard(node)
            if self.used[node] >= self.size:
                self.full.add(node)
        return gpus

    def take(self, node: int, task: str, gpus: int) -> None:
        on = self.result[node]
        on[task] -= gpus
        self.totals[task] -= gpus
        self.used[node] -= gpus
        self.full.discard(node)
        if self.used[node] == 0:
            self.empty.add(node)
            if self._empties is not None:
                heapq.heappush(self._empties, (self.order()[node], node))
        where = self.on(task)
        if on[task] == 0:
            del on[task]
            del where[node]
        else:
            where[node] = on[task]

    def leave(self, node: int) -> None:
        """``node`` goes out of service, and its workers with it."""
        for task, gpus in list(self.result.get(node, {}).items()):
            self.take(node, task, gpus)
        self.result.pop(node, None)
        self.used.pop(node, None)
        self.empty.discard(node)
        self.full.discard(node)
        self.in_service.discard(node)

    def join(self, node: int) -> None:
        """``node`` comes into service, empty."""
        self.in_service.add(node)
        self.empty.add(node)

    def drop(self, task: str) -> None:
        """Every worker of ``task`` leaves."""
        for node, gpus in list(self.on(task).items()):
            self.take(node, task, gpus)

    def order(self) -> dict[int, int]:
        """node -> its place in ``nodes``."""
        if self._order is None:
            self._order = {n: i for i, n in enumerate(self.nodes)}
        return self._order

    def first_empty(self) -> int | None:
        """The first node in the order of ``nodes`` that holds no worker (a heap of them, made
        when first asked: a task after task takes whole nodes from the front)."""
        if self._empties is None:
            order = self.order()
            self._empties = [(order[n], n) for n in self.empty]
            heapq.heapify(self._empties)
        while self._empties and self._empties[0][1] not in self.empty:
            heapq.heappop(self._empties)  # (filled since it was pushed)
        return self._empties[0][1] if self._empties else None

    def ordered(self) -> Assignment:
        """The placement, its nodes in the order of ``nodes``, those holding nothing left out."""
        if len(self.result) * 8 > len(self.nodes):  # (most nodes: read in order, not sorted)
            return {n: r for n in self.nodes if (r := self.result.get(n))}
        return {n: r for n in sorted(self.result, key=self.order().__getitem__) if (r := self.result[n])}


@dataclass(frozen=True)
class _Kept:
    """How a node's row of the previous placement stays: the workers of tasks still placed, in
    whole units; copied whole where every task in it is placed in single workers (``single``,
    the usual case)."""

    placed: frozenset[str]
    single: frozenset[str]
    units: Mapping[str, int]

    @classmethod
    def of(cls, counts: Mapping[str, int], units: Mapping[str, int]) -> _Kept:
        placed = frozenset(t for t, c in counts.items() if c > 0)
        return cls(placed, frozenset(t for t in placed if units[t] == 1), units)

    def row(self, held: Mapping[str, int]) -> dict[str, int]:
        """The row as it stays (empty: none of it)."""
        units = self.units
        return {t: _whole(g, units[t]) for t, g in held.items() if t in self.placed and g >= units[t]}


def _place(
    counts: Mapping[str, int],
    nodes: Sequence[int],
    gpus_per_node: int,
    previous: Mapping[int, Mapping[str, int]],
    units: Mapping[str, int],
) -> Assignment:
    return _build(_Layout(nodes, gpus_per_node, previous, _Kept.of(counts, units)), counts, units)


def _build(layout: _Layout, counts: Mapping[str, int], units: Mapping[str, int]) -> Assignment:
    """The placement from ``layout``, the workers that stay: surplus ones leave, new ones come."""
    for task in sorted(counts):  # surplus workers leave the nodes where the task has the fewest
        surplus = layout.placed(task) - counts[task]
        if surplus <= 0:
            continue
        on = layout.on(task)
        for node in sorted(on, key=lambda n: (on[n], -n)):
            if surplus <= 0:
                break
            take = min(surplus, on[node])
            layout.take(node, task, take)
            surplus -= take
    # Largest units first (first-fit decreasing, which packs units that divide each other and the
    # node size without waste), then the tasks that need the most.
    growing = sorted(counts, key=lambda t: (-units[t], -(counts[t] - layout.placed(t)), t))
    for task in growing:
        if _grow(layout, task, counts[task] - layout.placed(task), units[task]) > 0:
            if max(units.values(), default=1) == 1:
                raise AssertionError("placement ran out of GPUs although the total fits")
            raise _Scattered
    return layout.ordered()


def _grow(layout: _Layout, task: str, need: int, unit: int) -> int:
    """Put ``need`` more workers of ``task``: beside its own, then on whole free nodes, then
    wherever most is free; what could not be put."""
    if need <= 0:
        return 0
    size, on = layout.size, layout.on(task)
    for node in sorted(on.keys() - layout.full, key=lambda n: (-on[n], n)):  # (a full node takes none)
        if need <= 0:
            break
        need -= layout.put(node, task, _whole(min(need, layout.free(node)), unit))
    while need >= size and (empty := layout.first_empty()) is not None:
        need -= layout.put(empty, task, size)
    if need > 0:
        with_room = layout.in_service - layout.full
        for node in sorted(with_room, key=lambda n: (-layout.free(n), n)):
            if need <= 0:
                break
            need -= layout.put(node, task, _whole(min(need, layout.free(node)), unit))
    return need


def _whole(gpus: int, unit: int) -> int:
    return gpus - gpus % unit


class CarriedPlacement:
    """``place`` (workers in single units) for a caller that places again and again, each time
    from the placement it was last given, less the nodes it took out of service since: the
    simulator, thousands of times a run. The layout of the last placement is carried on (the
    nodes gone and back, the tasks no longer placed, applied to it) instead of being read again
    from every node: at 2,048 nodes that reading was half a 16,384-GPU scenario's time. Anything
    else given (another placement, a row replaced or added) is placed afresh. It gives what
    ``place`` gives (``tests/test_planner.py`` compares them over random sequences of events).
    The rows of a placement it gave stay its own: the caller changes none of them (it may drop
    a node's), and they change as it places again."""

    def __init__(self) -> None:
        self._layout: _Layout | None = None

    def place(
        self,
        counts: Mapping[str, int],
        nodes: Sequence[int],
        gpus_per_node: int,
        previous: Mapping[int, Mapping[str, int]],
    ) -> Assignment:
        if sum(counts.values()) > len(nodes) * gpus_per_node:
            return place(counts, nodes, gpus_per_node, previous)  # (its error)
        units = dict.fromkeys(counts, 1)
        layout, self._layout = self._carried(counts, nodes, gpus_per_node, previous), None
        if layout is None:
            layout = _Layout(nodes, gpus_per_node, previous, _Kept.of(counts, units))
        placed = _build(layout, counts, units)
        self._layout = layout
        return placed

    def _carried(
        self,
        counts: Mapping[str, int],
        nodes: Sequence[int],
        gpus_per_node: int,
        previous: Mapping[int, Mapping[str, int]],
    ) -> _Layout | None:
        """The last layout, brought to ``nodes`` and ``counts``; None where ``previous`` is not
        the placement last given (its rows the same objects, checked without a loop of Python's),
        less the rows of nodes now out of service."""
        layout = self._layout
        if layout is None or layout.size != gpus_per_node:
            return None
        held, given = layout.result, previous.keys()
        same = map(is_, map(previous.__getitem__, given), map(held.__getitem__, given))
        if not given <= held.keys() or not all(same):
            return None
        service = set(nodes)
        out, back = layout.in_service - service, service - layout.in_service
        if any(held[n] and n not in out for n in held.keys() - given):
            return None  # a row taken away from a node still in service
        layout._empties, layout._order, layout.nodes = None, None, nodes
        for node in out:
            layout.leave(node)
        for node in back:
            layout.join(node)
        for task in [t for t, n in layout.totals.items() if n > 0 and counts.get(t, 0) <= 0]:
            layout.drop(task)
        return layout

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

from collections.abc import Mapping, Sequence

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
    """A placement being built: who is where, with running totals (a task's workers placed, a
    node's slots used) kept as workers are taken off and put on: summing them afresh was most of
    a placement's time at 2,048 nodes."""

    def __init__(self, result: Assignment, gpus_per_node: int) -> None:
        self.result, self.size = result, gpus_per_node
        self.used = {n: sum(r.values()) for n, r in result.items()}
        self.totals: dict[str, int] = {}
        for r in result.values():
            for t, g in r.items():
                self.totals[t] = self.totals.get(t, 0) + g

    def placed(self, task: str) -> int:
        return self.totals.get(task, 0)

    def free(self, node: int) -> int:
        return self.size - self.used[node]

    def put(self, node: int, task: str, gpus: int) -> int:
        """Put up to ``gpus`` more of ``task`` on ``node``; how many were put."""
        gpus = max(gpus, 0)
        if gpus:
            self.result[node][task] = self.result[node].get(task, 0) + gpus
            self.totals[task] = self.totals.get(task, 0) + gpus
            self.used[node] += gpus
        return gpus

    def take(self, node: int, task: str, gpus: int) -> None:
        self.result[node][task] -= gpus
        self.totals[task] -= gpus
        self.used[node] -= gpus
        if self.result[node][task] == 0:
            del self.result[node][task]


def _place(
    counts: Mapping[str, int],
    nodes: Sequence[int],
    gpus_per_node: int,
    previous: Mapping[int, Mapping[str, int]],
    units: Mapping[str, int],
) -> Assignment:
    kept: Assignment = {n: {} for n in nodes}
    for n, held in previous.items():  # (nodes out of service are no longer in ``nodes``)
        if n in kept:
            kept[n] = {
                t: _whole(g, units[t]) for t, g in held.items() if counts.get(t, 0) > 0 and g >= units[t]
            }
    layout = _Layout(kept, gpus_per_node)
    for task in sorted(counts):  # surplus workers leave the nodes where the task has the fewest
        surplus = layout.placed(task) - counts[task]
        if surplus <= 0:
            continue
        for node in sorted((n for n in nodes if kept[n].get(task)), key=lambda n: (kept[n][task], -n)):
            if surplus <= 0:
                break
            take = min(surplus, kept[node][task])
            layout.take(node, task, take)
            surplus -= take
    # Largest units first (first-fit decreasing, which packs units that divide each other and the
    # node size without waste), then the tasks that need the most.
    growing = sorted(counts, key=lambda t: (-units[t], -(counts[t] - layout.placed(t)), t))
    for task in growing:
        if _grow(layout, nodes, task, counts[task] - layout.placed(task), units[task]) > 0:
            if max(units.values(), default=1) == 1:
                raise AssertionError("placement ran out of GPUs although the total fits")
            raise _Scattered
    return {n: r for n, r in kept.items() if r}


def _grow(layout: _Layout, nodes: Sequence[int], task: str, need: int, unit: int) -> int:
    """Put ``need`` more workers of ``task``: beside its own, then on whole free nodes, then
    wherever most is free; what could not be put."""
    if need <= 0:
        return 0
    result, size = layout.result, layout.size
    own = sorted((n for n in nodes if result[n].get(task)), key=lambda n: (-result[n][task], n))
    for node in own:
        if need <= 0:
            break
        need -= layout.put(node, task, _whole(min(need, layout.free(node)), unit))
    if need >= size:
        for node in [n for n in nodes if layout.free(n) == size]:
            if need < size:
                break
            need -= layout.put(node, task, size)
    if need > 0:
        for node in sorted(nodes, key=lambda n: (-layout.free(n), n)):
            if need <= 0:
                break
            need -= layout.put(node, task, _whole(min(need, layout.free(node)), unit))
    return need


def _whole(gpus: int, unit: int) -> int:
    return gpus - gpus % unit

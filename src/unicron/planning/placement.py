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


def _place(
    counts: Mapping[str, int],
    nodes: Sequence[int],
    gpus_per_node: int,
    previous: Mapping[int, Mapping[str, int]],
    units: Mapping[str, int],
) -> Assignment:
    result: Assignment = {
        n: {
            t: _whole(g, units[t])
            for t, g in previous.get(n, {}).items()
            if counts.get(t, 0) > 0 and g >= units[t]
        }
        for n in nodes
    }

    def placed(task: str) -> int:
        return sum(r.get(task, 0) for r in result.values())

    def free(node: int) -> int:
        return gpus_per_node - sum(result[node].values())

    for task in sorted(counts):
        surplus = placed(task) - counts[task]
        for node in sorted((n for n in nodes if result[n].get(task)), key=lambda n: (result[n][task], -n)):
            if surplus <= 0:
                break
            take = min(surplus, result[node][task])
            result[node][task] -= take
            surplus -= take
            if result[node][task] == 0:
                del result[node][task]

    # Largest units first (first-fit decreasing, which packs units that divide each other and the
    # node size without waste), then the tasks that need the most.
    growing = sorted(counts, key=lambda t: (-units[t], -(counts[t] - placed(t)), t))
    for task in growing:
        need, unit = counts[task] - placed(task), units[task]
        if need <= 0:
            continue
        own = sorted((n for n in nodes if result[n].get(task)), key=lambda n: (-result[n][task], n))
        empty = [n for n in nodes if free(n) == gpus_per_node]
        for node in own:
            need -= _put(result, node, task, _whole(min(need, free(node)), unit))
        for node in empty:
            if need < gpus_per_node:
                break
            need -= _put(result, node, task, gpus_per_node)
        for node in sorted(nodes, key=lambda n: (-free(n), n)):
            if need <= 0:
                break
            need -= _put(result, node, task, _whole(min(need, free(node)), unit))
        if need > 0:
            if max(units.values(), default=1) == 1:
                raise AssertionError("placement ran out of GPUs although the total fits")
            raise _Scattered
    return {n: r for n, r in result.items() if r}


def _whole(gpus: int, unit: int) -> int:
    return gpus - gpus % unit


def _put(result: Assignment, node: int, task: str, gpus: int) -> int:
    if gpus > 0:
        result[node][task] = result[node].get(task, 0) + gpus
    return max(gpus, 0)

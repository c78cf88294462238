"""Placement: which nodes a plan's workers go to, moving as few as possible.

Given worker counts per task and the previous assignment, keep every worker that may stay,
remove surplus workers from the nodes where a task has the fewest (freeing whole nodes), and put
new workers first beside the task's own, then on whole free nodes, then wherever most is free.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

Assignment = dict[int, dict[str, int]]


def pack(counts: Mapping[str, int], nodes: Sequence[int], gpus_per_node: int) -> Assignment:
    """A fresh placement with nothing to preserve."""
    return place(counts, nodes, gpus_per_node, {})


def place(
    counts: Mapping[str, int],
    nodes: Sequence[int],
    gpus_per_node: int,
    previous: Mapping[int, Mapping[str, int]],
) -> Assignment:
    need_total = sum(counts.values())
    if need_total > len(nodes) * gpus_per_node:
        raise ValueError(f"{need_total} GPUs asked for, {len(nodes) * gpus_per_node} available")
    result: Assignment = {
        n: {t: g for t, g in previous.get(n, {}).items() if counts.get(t, 0) > 0} for n in nodes
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

    growing = sorted(counts, key=lambda t: (-(counts[t] - placed(t)), t))
    for task in growing:
        need = counts[task] - placed(task)
        if need <= 0:
            continue
        own = sorted((n for n in nodes if result[n].get(task)), key=lambda n: (-result[n][task], n))
        empty = [n for n in nodes if free(n) == gpus_per_node]
        for node in own:
            need -= _put(result, node, task, min(need, free(node)))
        for node in empty:
            if need < gpus_per_node:
                break
            need -= _put(result, node, task, gpus_per_node)
        for node in sorted(nodes, key=lambda n: (-free(n), n)):
            if need <= 0:
                break
            need -= _put(result, node, task, min(need, free(node)))
        if need > 0:
            raise AssertionError("placement ran out of GPUs although the total fits")
    return {n: r for n, r in result.items() if r}


def _put(result: Assignment, node: int, task: str, gpus: int) -> int:
    if gpus > 0:
        result[node][task] = result[node].get(task, 0) + gpus
    return max(gpus, 0)

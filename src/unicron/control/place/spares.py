"""Hot spares: slots the plan leaves idle hold a started worker for the task that would lose
most from a failure.

A spare is a worker process launched ahead (Python, PyTorch and the training script loaded)
that waits in its task's store until it is needed. When the task loses a worker, the survivors
shrink in place and the planner grows the task back; the grow then uses the spare (it takes the
newcomer's identity and its state from a live replica) instead of starting a process. A spare
holds no accelerator memory while it waits (it blocks before the model is built), so the plan
can take its slot back at any time: the spare is simply stopped.

Which task gets a spare: the one whose WAF drops most while it runs shrunk, i.e.
weight x (rate at its size - rate at the largest usable smaller size). Tasks that cannot shrink
in place (no usable smaller size, or ``recovery: restart``) gain nothing from a spare.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from unicron.core.livespecs import LiveTaskSpec
from unicron.planning.throughput import ThroughputCurve


def spare_gains(
    specs: Sequence[LiveTaskSpec],
    workers: Mapping[str, int],
    curves: Mapping[str, ThroughputCurve],
) -> list[tuple[float, str]]:
    """(gain, task) for every running task a spare can help, best first."""
    out = []
    for spec in specs:
        n = workers.get(spec.name, 0)
        if n == 0 or spec.run.recovery != "in_process" or spec.run.replica_size > 1:
            continue  # (a sharded replica comes back whole: single-rank spares do not help it)
        shrunk = next((k for k in range(n - 1, 0, -1) if spec.is_usable(k)), 0)  # the largest below n
        if shrunk == 0:
            continue
        rate = curves[spec.name].evaluate(np.array([n, shrunk], dtype=np.int64)).rate
        gain = spec.weight * float(rate[0] - rate[1])
        if gain > 0:
            out.append((gain, spec.name))
    return sorted(out, key=lambda g: (-g[0], g[1]))


def choose(
    free: Mapping[str, int],
    gains: Sequence[tuple[float, str]],
    have: Mapping[str, int],
    homes: Mapping[str, set[str]],
    per_task: int = 1,
) -> list[tuple[str, str]]:
    """(task, node) for each new spare: the best tasks first, each up to ``per_task`` spares,
    on a node it already runs on where there is one with a free slot (its state then comes
    from a replica on the same node)."""
    left = dict(free)
    out: list[tuple[str, str]] = []
    for _, task in gains:
        for _ in range(per_task - have.get(task, 0)):
            nodes = [n for n, c in sorted(left.items()) if c > 0]
            if not nodes:
                return out
            node = next((n for n in nodes if n in homes.get(task, set())), nodes[0])
            left[node] -= 1
            out.append((task, node))
    return out


def seated(waiting: Sequence[tuple[str, str]], seats: Mapping[tuple[str, str], int]) -> list[bool]:
    """For each waiting spare ((task, node), in order): whether it fills one of the seats the
    plan grows its own task by on its own node (``seats``: (task, node) -> newcomers). Such a
    spare is one of the plan's workers there: the grow takes spares first
    (``brain/membership.py:new_processes``), so it is kept for the grow, not stopped for a new process to
    start in its slot."""
    left = dict(seats)
    out = []
    for key in waiting:
        out.append(left.get(key, 0) > 0)
        if out[-1]:
            left[key] -= 1
    return out


def in_the_way(
    waiting: Sequence[tuple[str, str]], sits: Sequence[bool], planned: Mapping[str, int], slots: int
) -> list[int]:
    """The waiting spares (indexes into ``waiting``: (task, node)) to stop so that the plan's
    workers (``planned``: node -> workers) fit in each node's ``slots``: on each node, as many
    as it is over, of those that fill no seat of the plan (``seated``)."""
    out: list[int] = []
    for node in sorted({n for _, n in waiting}):
        others = [i for i, (_, n) in enumerate(waiting) if n == node and not sits[i]]
        out += others[: max(0, planned.get(node, 0) + len(others) - slots)]
    return out

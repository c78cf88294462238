"""Pinning for the overhead cells: each worker on a core of its own, the rest on the others.

Runs of the same side in the same cell differ by up to a quarter on a shared machine, more than
the 2% the overhead target asks to resolve; unpinned cells on a lent machine's 16 cores spread
further still (docs/gpu.md). Pinning takes away two causes of that noise, alike on both sides:
workers moved between cores, and the launchers, coordinator, agent or lighthouse running on a
worker's core.

- ``plan``: which cores the control processes get and which core each worker gets; none where
  the machine has fewer cores than workers + 1 (the control processes would share a worker's).
- ``pinned``: for one cell, this process and every process it starts (launchers, coordinator,
  agents, lighthouse) on the control cores, and the workers' cores in ``WORKER_CPUS``.
- ``pin_worker``: inside a worker (``bench/steptimes.py``, on every side alike), move this
  process to its own core by its index among the cell's workers.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

WORKER_CPUS = "UNICRON_BENCH_WORKER_CPUS"  # the workers' cores, by worker index, comma-separated


@dataclass(frozen=True)
class Pinning:
    """``control``: the cores of every process but the workers; ``workers``: worker i's core."""

    control: tuple[int, ...]
    workers: tuple[int, ...]

    def as_json(self) -> dict[str, list[int]]:
        return {"control": list(self.control), "workers": list(self.workers)}


def plan(cores: set[int] | frozenset[int], workers: int) -> Pinning | None:
    """The workers on the highest-numbered cores, one each, the control processes on the rest;
    None with fewer than ``workers + 1`` cores (a worker's core would not be its own)."""
    ordered = sorted(cores)
    if workers < 1 or len(ordered) < workers + 1:
        return None
    return Pinning(tuple(ordered[:-workers]), tuple(ordered[-workers:]))


def worker_index(env: Mapping[str, str]) -> int:
    """This worker's index among the cell's: its local rank, after the ranks of the replica
    groups before its own where each group is a launcher of its own (torchft's
    ``REPLICA_GROUP_ID``); one launcher (torchrun + DDP) or one agent (Unicron) numbers them all."""
    local = int(env.get("LOCAL_RANK", "0"))
    group = env.get("REPLICA_GROUP_ID")
    return local if group is None else int(group) * int(env.get("LOCAL_WORLD_SIZE", "1")) + local


def pin_worker(env: Mapping[str, str] = os.environ) -> int | None:
    """Move this process to its core (``WORKER_CPUS``, by ``worker_index``); the core, or None
    where the cell is not pinned."""
    cores = env.get(WORKER_CPUS)
    if not cores:
        return None
    listed = [int(c) for c in cores.split(",")]
    index = worker_index(env)
    if index >= len(listed):
        raise RuntimeError(f"worker {index} has no core in {WORKER_CPUS}={cores}: pin as many workers as run")
    os.sched_setaffinity(0, {listed[index]})
    return listed[index]


@contextlib.contextmanager
def pinned(workers: int) -> Iterator[Pinning | None]:
    """For one cell of ``workers`` workers: this process (and so what it starts) on the control
    cores, the workers' cores in the environment; as before afterwards. Yields the pinning, or
    None (nothing changed) where the cores are too few."""
    before = os.sched_getaffinity(0)
    pinning = plan(before, workers)
    if pinning is None:
        yield None
        return
    os.sched_setaffinity(0, set(pinning.control))
    os.environ[WORKER_CPUS] = ",".join(map(str, pinning.workers))
    try:
        yield pinning
    finally:
        os.environ.pop(WORKER_CPUS, None)
        os.sched_setaffinity(0, before)

"""Pinning for the overhead cells: each worker on a core of its own, the rest on the others.

Runs of the same side in the same cell differ by up to a quarter on a shared machine, more than
the 2% the overhead target asks to resolve; unpinned cells on a lent machine's 16 cores spread
further still (docs/gpu.md). Pinning takes away two causes of that noise, alike on both sides:
workers moved between cores, and the launchers, coordinator, agent or lighthouse running on a
worker's core.

- ``plan``: which cores the control processes get and which core each worker gets; none where
  the machine has fewer physical cores than workers + 1 (the control processes would share a
  worker's). A core's other hardware threads (SMT siblings, ``threads``) are left idle: a
  sibling shares the worker's execution units and caches, so a worker beside a busy sibling
  (another worker, or the control processes) runs slower by however busy it is. The lent
  machine's 16 cores are hardware threads of fewer physical cores; its pinned cells of
  2026-11-27 put both workers on the two highest-numbered threads, whatever they shared.
- ``plan_pair``: the same for two cells run at the same time on disjoint cores.
- ``pinned``: for one cell, this process and every process it starts (launchers, coordinator,
  agents, lighthouse) on the control cores, and the workers' cores in ``WORKER_CPUS``.
- ``pin_worker``: inside a worker (``bench/steptimes.py``, on every side alike), move this
  process to its own core by its index among the cell's workers.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

WORKER_CPUS = "UNICRON_BENCH_WORKER_CPUS"  # the workers' cores, by worker index, comma-separated


@dataclass(frozen=True)
class Pinning:
    """``control``: the cores of every process but the workers; ``workers``: worker i's core;
    ``idle``: the workers' cores' siblings, on which nothing runs."""

    control: tuple[int, ...]
    workers: tuple[int, ...]
    idle: tuple[int, ...] = ()

    def as_json(self) -> dict[str, list[int]]:
        return {"control": list(self.control), "workers": list(self.workers), "idle": list(self.idle)}


def threads(
    cores: set[int] | frozenset[int], topology: Path = Path("/sys/devices/system/cpu")
) -> list[frozenset[int]]:
    """``cores`` grouped by physical core (the kernel's ``thread_siblings_list``), each group the
    threads of one core that are in ``cores``; a core whose siblings cannot be read is a group of
    its own."""
    groups: set[frozenset[int]] = set()
    for core in cores:
        try:
            listed = (topology / f"cpu{core}" / "topology" / "thread_siblings_list").read_text()
        except OSError:
            groups.add(frozenset({core}))
            continue
        groups.add(frozenset(_cpu_list(listed)) & frozenset(cores) | {core})
    return sorted(groups, key=min)


def _cpu_list(text: str) -> set[int]:
    """A kernel CPU list ("0,8" or "0-1,4") as a set."""
    out: set[int] = set()
    for part in text.strip().split(","):
        first, _, last = part.partition("-")
        out.update(range(int(first), int(last or first) + 1))
    return out


def plan(physical: list[frozenset[int]], workers: int) -> Pinning | None:
    """The workers on the highest-numbered physical cores (``threads``), one each, on its lowest
    thread, its other threads idle; the control processes on the other physical cores. None with
    fewer than ``workers + 1`` physical cores (a worker's core would not be its own)."""
    if workers < 1 or len(physical) < workers + 1:
        return None
    theirs, control = physical[-workers:], physical[:-workers]
    return Pinning(
        tuple(sorted(c for group in control for c in group)),
        tuple(min(group) for group in theirs),
        tuple(sorted(c for group in theirs for c in group if c != min(group))),
    )


def plan_pair(physical: list[frozenset[int]], workers: int) -> tuple[Pinning, Pinning] | None:
    """For two cells run at the same time (``bench/side_by_side.py``): each cell's workers on
    physical cores of their own, the first cell's on the highest-numbered, the second's on the
    next; the control processes of both on the rest. None with fewer than ``2 * workers + 1``
    physical cores."""
    if workers < 1 or len(physical) < 2 * workers + 1:
        return None
    first = plan(physical, workers)
    second = plan(physical[:-workers], workers)
    assert first is not None and second is not None  # the cores suffice for both
    return replace(first, control=second.control), second


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
    pinning = plan(threads(os.sched_getaffinity(0)), workers)
    if pinning is None:
        yield None
        return
    with on_cores(pinning.control):
        os.environ[WORKER_CPUS] = ",".join(map(str, pinning.workers))
        try:
            yield pinning
        finally:
            os.environ.pop(WORKER_CPUS, None)


@contextlib.contextmanager
def on_cores(cores: tuple[int, ...] | None) -> Iterator[None]:
    """This process (and so every process it starts) on ``cores``, as before afterwards;
    nothing changed with None."""
    before = os.sched_getaffinity(0)
    if cores is not None:
        os.sched_setaffinity(0, set(cores))
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)

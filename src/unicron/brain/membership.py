"""The membership arithmetic of in-place shrinks and grows, pure.

A generation is one membership of a task's workers. Survivors of a failure, or the members a
planned shrink keeps, form the next generation without restarting (they rebuild their process
group from the membership posted in the task's store); newcomers of a grow join live members at
a step boundary and take their state from them. The coordinator carries these out
(``control/recover/generations.py``); the simulator counts with them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from unicron.brain.effects import Effect, EndWorkers, Launch, Record, Resized, StopWorker, Switch, UseSpare
from unicron.brain.records import TaskRecord, WorkerRecord
from unicron.core.protocol import Membership
from unicron.core.states import WorkerPhase


def new_processes(placement: Mapping[str, int], spare_nodes: Sequence[str]) -> dict[str, int]:
    """Where a grow starts new processes: ``placement`` (node -> newcomers) less the places that
    hot spares take (spares on ``spare_nodes``, in order, as many as there are newcomers): a
    spare stands in for a newcomer on its own node if the placement has one there, else for one
    on the node with the most (``grow`` renames them so; ``control/place/moves.py:parts_of``
    counts the slots they hold as the grow's own)."""
    left = dict(placement)
    for node in spare_nodes[: sum(placement.values())]:
        target = node if left.get(node) else max(left, key=lambda n: left[n])
        left[target] -= 1
    return {n: c for n, c in left.items() if c > 0}


@dataclass(frozen=True)
class Shrink:
    membership: Membership
    kept: list[WorkerRecord]
    left: list[WorkerRecord]  # live workers that do not go on (failed, or let go by the plan)


def whole_replicas(kept: Sequence[WorkerRecord], size: int) -> list[WorkerRecord]:
    """Those of ``kept`` whose replica (ranks ``r * size`` to ``r * size + size - 1`` of their
    generation) is kept whole: a sharded replica is useless without any one of its shards.
    ``kept``: members of one generation (a rank each), so no replica counts more than ``size``,
    and all are whole when their number is ``size`` times that of the replicas: the usual case,
    at every failure of a 16,384-GPU task, answered without a second pass."""
    if size == 1:  # (each its own replica)
        return list(kept)
    replicas = [w.rank // size for w in kept]
    counts = Counter(replicas)
    if len(counts) * size == len(replicas):
        return list(kept)
    return [w for w, replica in zip(kept, replicas, strict=True) if counts[replica] == size]


def survivors(
    live: Sequence[WorkerRecord],
    failed: Collection[int],
    healthy: Collection[str],
    usable: Callable[[int], bool],
    generation: int,
    replica_size: int = 1,
) -> Shrink | str:
    """The next generation after ``failed`` ranks (and every rank on a node no longer healthy)
    are gone: the largest usable number of survivors, lowest ranks first; with replicas, only
    whole ones (the other members of a failed rank's replica leave with it). A string says why
    there is none."""
    failed = frozenset(failed)
    alive = [w for w in live if w.rank not in failed and w.node in healthy]
    alive = whole_replicas(alive, replica_size)
    keep = next((k for k in range(len(alive), 0, -1) if usable(k)), 0)  # the largest usable
    if keep == 0:
        return f"{len(alive)} survivor(s), no usable size"
    kept = alive[:keep]
    if not whole_replicas([w for w in kept if not w.joining], replica_size):
        # Newcomers take the state from a live member as the generation trains its first step:
        # without one they would go on from their checkpoint, steps lost while none is recorded.
        newcomers = sorted(w.rank for w in kept if w.joining)
        return f"no survivor holds the task's state (rank(s) {newcomers} joined and had not taken it yet)"
    gone = set(failed) | {w.rank for w in live if w.node not in healthy}
    membership = Membership(
        generation=generation,
        world_size=keep,
        ranks={w.rank: i for i, w in enumerate(kept)},
        failed=sorted(gone),
        abandon=True,
    )
    staying = {w.rank for w in kept}  # (one generation's members: a rank each)
    return Shrink(membership, kept, [w for w in live if w.rank not in staying])


def planned_shrink(
    live: Sequence[WorkerRecord],
    wanted: dict[str, int],
    usable: Callable[[int], bool],
    generation: int,
    replica_size: int = 1,
) -> Shrink | None:
    """Keep the members on the nodes the placement keeps (``wanted``: node -> count), in whole
    replicas; None when that leaves nobody, loses nobody, or an unusable size."""
    quota = dict(wanted)
    kept = []
    for w in sorted(live, key=lambda w: w.rank):
        if quota.get(w.node, 0) > 0:
            kept.append(w)
            quota[w.node] -= 1
    kept = whole_replicas(kept, replica_size)
    staying = {w.rank for w in kept}
    left = [w for w in sorted(live, key=lambda w: w.rank) if w.rank not in staying]
    if not kept or not left or not usable(len(kept)):
        return None
    membership = Membership(
        generation=generation, world_size=len(kept), ranks={w.rank: i for i, w in enumerate(kept)}
    )
    return Shrink(membership, kept, left)


def grown(live: Sequence[WorkerRecord], added: int, generation: int) -> tuple[Membership, list[int]]:
    """Live members keep their ranks; ``added`` newcomers take the next ones."""
    membership = Membership(
        generation=generation, world_size=len(live) + added, ranks={w.rank: w.rank for w in live}
    )
    return membership, list(range(len(live), len(live) + added))


@dataclass
class Growth:
    """A grow under way: the generation its newcomers join, its membership, their ranks in it,
    and when it began."""

    generation: int
    membership: Membership
    newcomers: list[int]
    since: float


@dataclass(frozen=True)
class Grow:
    """A grow the plan decided: the grow under way it starts, its effects (hot spares renamed
    into newcomers, new processes launched for the rest, the event) and the spares it used."""

    growth: Growth
    effects: tuple[Effect, ...]
    spares_used: tuple[int, ...]


def grow(
    task: TaskRecord,
    live: Sequence[WorkerRecord],
    generation: int,
    placement: Mapping[str, int],
    spares: Sequence[tuple[int, str, int]],
    launch: Callable[[int], tuple[list[str], dict[str, str]]],
    reason: str,
    now: float,
) -> Grow:
    """Newcomers for ``task``'s ``generation`` (``placement``: node -> newcomers), from hot
    ``spares`` (rank, node, local slot) first, then new processes; the live members make room for
    them at a step boundary once they are ready. ``launch(world)``: the new processes' program
    and environment for a generation of ``world`` workers."""
    name = task.name
    membership, newcomers = grown(live, sum(placement.values()), generation)
    world = membership.world_size
    used = [(s, node, local, rank) for (s, node, local), rank in zip(spares, newcomers, strict=False)]
    renamed = [UseSpare(name, s, node, local, generation, rank, world) for s, node, local, rank in used]
    started = new_processes(placement, [node for _, node, _ in spares])
    argv, env = launch(world)
    spares_used = tuple(s for s, *_ in used)
    detail = {
        "generation": generation,
        "workers": world,
        "placement": dict(placement),  # node -> newcomers: hot spares there and new processes
        "new_processes": started,
        "spares_used": list(spares_used),
        "reason": reason,
    }
    launched = Launch(name, generation, world, started, len(live) + len(used), argv, env, joining=True)
    effects: tuple[Effect, ...] = (*renamed, launched, Record("task_grow", name, None, detail))
    return Grow(Growth(generation, membership, newcomers, now), effects, spares_used)


def planned_shrink_effects(task: TaskRecord, before: int, shrink: Shrink, reason: str) -> tuple[Effect, ...]:
    """A shrink the plan decided (``planned_shrink``): the members it keeps form the next
    generation at their next step boundary; the others leave there, having lost nothing."""
    detail = {
        "generation": shrink.membership.generation,
        "before": before,
        "workers": len(shrink.kept),
        "leaving": [w.rank for w in shrink.left],
        "reason": reason,
    }
    switch = Switch(task.name, task.generation, shrink.membership, tuple(shrink.kept))
    return (switch, Record("task_shrink", task.name, None, detail))


def joined(task: TaskRecord, growth: Growth, live: Sequence[WorkerRecord], now: float) -> tuple[Effect, ...]:
    """Every newcomer of ``growth`` is ready: the live members (``live``, of ``task``'s
    generation) and they form the grow's generation."""
    kept = tuple(w for w in live if w.rank in growth.membership.ranks)
    world = growth.membership.world_size
    detail = {"generation": growth.generation, "workers": world, "waited_s": round(now - growth.since, 3)}
    return (
        Switch(task.name, task.generation, growth.membership, kept),
        Resized(task.name, growth.generation, world),
        Record("task_grown", task.name, None, detail),
    )


def given_up(
    task: str, growth: Growth, newcomers: Sequence[WorkerRecord], event: str, why: str
) -> tuple[Effect, ...]:
    """A grow given up: exactly its ``newcomers`` are stopped (a generation-wide stop would reach
    the members too: it stops every generation up to the one named), their rows ended."""
    stops = tuple(StopWorker(w, 0.0) for w in newcomers)
    record = Record(event, task, None, {"generation": growth.generation, "why": why})
    return (*stops, EndWorkers(task, growth.generation, WorkerPhase.STOPPED), record)

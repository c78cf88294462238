"""What the coordinator does about a failure: pure functions of a snapshot, returning effects.

The ladder (``core/ladder.py``) asks for a tier (``core/tiers.py``); :func:`respond` carries out
the cheapest tier at or above it that applies to the cluster as the snapshot shows it, and says
why each tier below that could not:

- reattempt: every member, none lost, re-forms the group as the next generation;
- restart failed: the failed ranks are killed, the survivors re-form without them (the plan
  grows the task back with new processes that take their state from a live peer);
- reconfigure: as restart failed, and the blamed node leaves (isolated; its ranks leave too);
- from checkpoint: the generation stops, the task is relaunched from its newest checkpoint;
- fail task: the generation stops and the task fails.

A node the ladder isolates is isolated whichever tier is carried out. The applier carries the
effects out (``effects.Applier.apply``); tests check them on hand-built snapshots.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from unicron.brain.effects import Effect, Isolate, StopGeneration, StopWorker, Switch, TaskDown
from unicron.brain.membership import survivors
from unicron.brain.records import WorkerRecord
from unicron.brain.snapshot import Snapshot
from unicron.core import tiers
from unicron.core.ladder import Decision
from unicron.core.settings import Settings
from unicron.core.states import NodeState, TaskState
from unicron.core.taxonomy import ErrorKind
from unicron.core.tiers import Escalation, Tier, first_applicable, precondition

TASK_ENDED = "task ended"  # an incident still open when its task ended (finished, cancelled)
# Kinds whose node stays out until an operator resumes it (``unicron node resume``), not for the
# isolation period: a device that computed wrong values passes every check of its own between
# its faults, so waiting mends nothing (issue 55's quarantine).
UNTIL_RESUMED = frozenset({ErrorKind.SILENT_DATA_CORRUPTION})


@dataclass(frozen=True)
class Failure:
    """An incident as recovery sees it: where it struck and which ranks are known to be gone
    (``failed``: None when they cannot be told apart, so the survivors cannot go on alone)."""

    task: str
    node: str | None
    why: str
    failed: frozenset[int] | None


@dataclass(frozen=True)
class Response:
    tier: Tier  # the tier carried out
    # The tiers, from the one asked for, that could not apply (after a deadline, the first is the
    # tier that failed, and the last leads to the one carried out).
    escalations: tuple[Escalation, ...]
    effects: tuple[Effect, ...]


def isolation(
    snapshot: Snapshot, node: str, why: str, now: float, limits: Settings, kind: ErrorKind | None = None
) -> tuple[Effect, ...]:
    """Take a healthy node out for the isolation period, or, for a device that computed wrong
    values (``kind``), until an operator resumes it: a time out does not mend it (one that is not
    healthy stays as it is; none is taken out past the isolation budget: :func:`isolation_spent`)."""
    if snapshot.node_state(node) is not NodeState.HEALTHY or isolation_spent(snapshot, limits, now):
        return ()
    until = None if kind in UNTIL_RESUMED else now + limits.isolation_s
    return (Isolate(node, why, until, limits.failure_stop_grace_s),)


def isolation_spent(snapshot: Snapshot, limits: Settings, now: float) -> str | None:
    """Why no more node may be isolated now (None: one may): ``tiers.isolation_spent``. A node
    counts while its isolation runs, also while it is lost (it comes back isolated)."""
    running = {n for n, until in snapshot.isolated_until.items() if until is None or until > now}
    out = len(running | {n.name for n in snapshot.nodes.values() if n.state is NodeState.ISOLATED})
    return tiers.isolation_spent(out, len(snapshot.nodes), limits.max_isolated_fraction)


def in_place(
    snapshot: Snapshot,
    name: str,
    failed: Collection[int],
    usable: Callable[[int], bool],
    out: Collection[str] = (),
    replica_size: int = 1,
) -> tuple[Effect, ...] | str:
    """The survivors (on healthy nodes, not in ``out``; whole replicas) rebuild their group as
    the next generation and go on; nothing restarts. The failed ranks still on a healthy node
    are killed (a raising or hung process may linger); the rest of their replicas leave. A
    string says why that is not possible."""
    task = snapshot.task(name)
    healthy = snapshot.healthy() - set(out) if out else snapshot.healthy()  # (copied only if need be)
    live = snapshot.live(name)
    shrink = survivors(live, failed, healthy, usable, snapshot.next_generation[name], replica_size)
    if isinstance(shrink, str):
        return shrink
    stops = [StopWorker(w, 0.0) for w in shrink.left if w.rank in failed and w.node in healthy]
    switch = Switch(name, task.generation, shrink.membership, tuple(shrink.kept))
    return (*stops, switch, TaskDown(name, TaskState.STARTING))


def regrouped(effects: Collection[Effect]) -> dict[str, Any]:
    """What a generation re-formed in place is, for its event: the ``Switch`` among ``effects``."""
    for e in effects:
        if isinstance(e, Switch):
            m = e.membership
            survivors = sorted(w.rank for w in e.kept)
            return {
                "generation": m.generation,
                "workers": m.world_size,
                "failed": m.failed,
                "survivors": survivors,
            }
    return {}


def respond(
    snapshot: Snapshot,
    failure: Failure,
    decision: Decision,
    may_stay: bool,
    usable: Callable[[int], bool],
    limits: Settings,
    now: float,
    replica_size: int = 1,
) -> Response:
    """The effects of the cheapest tier at or above ``decision.tier`` that applies to
    ``failure``. ``may_stay``: the task recovers in place (its spec asks for it and no grow is
    under way)."""
    name, node = failure.task, failure.node
    isolated: tuple[Effect, ...] = ()
    if decision.isolate_node and node is not None:
        isolated = isolation(
            snapshot, node, f"{decision.kind.value} ({decision.why})", now, limits, decision.kind
        )
    planned: dict[Tier, tuple[Effect, ...]] = {}

    def why_not(tier: Tier) -> str | None:
        if (reason := precondition(tier, may_stay, failure.failed, node)) is not None or not tier.in_place:
            return reason
        assert failure.failed is not None  # (the precondition holds)
        leaving: tuple[Effect, ...] = isolated
        if tier is Tier.RECONFIGURE and node is not None and not isolated:
            if snapshot.node_state(node) is NodeState.HEALTHY and (
                spent := isolation_spent(snapshot, limits, now)
            ):
                return f"node {node} cannot leave: {spent}"
            why = f"{decision.kind.value}: the cluster is reconfigured without it"
            leaving = isolation(snapshot, node, why, now, limits, decision.kind)
        out = {node} if tier is Tier.RECONFIGURE and node is not None else set()
        out |= {e.node for e in leaving if isinstance(e, Isolate)}
        gone = frozenset() if tier is Tier.REATTEMPT else failure.failed
        stay = in_place(snapshot, name, gone, usable, out, replica_size)
        if isinstance(stay, str):
            return stay
        planned[tier] = (*leaving, *stay)
        return None

    tier, escalations = first_applicable(decision.tier, why_not)
    if tier.in_place:
        return Response(tier, escalations, planned[tier])
    stop = StopGeneration(name, snapshot.task(name).generation, limits.failure_stop_grace_s)
    if tier is Tier.FROM_CHECKPOINT:
        return Response(tier, escalations, (*isolated, stop, TaskDown(name, TaskState.RESTARTING)))
    down = TaskDown(name, TaskState.FAILED, reason=f"{failure.why}: {decision.why}")
    return Response(tier, escalations, (*isolated, stop, down))


@dataclass(frozen=True)
class Stalled:
    """A recovery in place that regained no step by its deadline: the tier it was under, the
    generation it formed, its members now and those that never reached it (stuck on the way),
    and the nodes where members were stuck in earlier tiers."""

    task: str
    tier: Tier
    generation: int
    members: tuple[WorkerRecord, ...]
    stuck: tuple[WorkerRecord, ...]
    stuck_before: frozenset[str]


def escalate(
    snapshot: Snapshot,
    stalled: Stalled,
    may_stay: bool,
    usable: Callable[[int], bool],
    limits: Settings,
    now: float,
    replica_size: int = 1,
) -> Response:
    """The next tier after ``stalled.tier`` that applies, acting on the members stuck on the way:
    restart failed stops them and the others re-form without them; reconfigure also takes their
    nodes out; a restart from the checkpoint isolates the nodes where members were stuck before
    (a tier that acted on them failed). The first escalation says why the tier failed."""
    name, g, stuck = stalled.task, stalled.generation, stalled.stuck
    some = 0 < len(stuck) < len(stalled.members)
    ranks, nodes = frozenset(w.rank for w in stuck), frozenset(w.node for w in stuck)
    planned: dict[Tier, tuple[Effect, ...]] = {}

    def why_not(tier: Tier) -> str | None:
        if not tier.in_place:
            return None
        if not may_stay:
            return "the task no longer recovers in place (a grow under way)"
        if not some:
            return f"{'no' if stuck else 'every'} member reached generation {g}: none to leave out"
        leaving: tuple[Effect, ...] = ()
        if tier is Tier.RECONFIGURE:
            if spent := isolation_spent(snapshot, limits, now):
                return f"the stuck members' nodes cannot leave: {spent}"
            why = f"rank(s) {sorted(ranks)} stuck on the way into generation {g}"
            leaving = tuple(e for n in sorted(nodes) for e in isolation(snapshot, n, why, now, limits))
        out = nodes if tier is Tier.RECONFIGURE else frozenset()
        stay = in_place(snapshot, name, ranks, usable, out, replica_size)
        if isinstance(stay, str):
            return stay
        planned[tier] = (*leaving, *stay)
        return None

    why = f"no step within {limits.recovery_deadline_s:g} s"
    if some:
        why += f"; rank(s) {sorted(ranks)} never reached generation {g}"
    tier, passed = first_applicable(stalled.tier.next(), why_not)
    steps = (Escalation(stalled.tier, stalled.tier.next(), why), *passed)
    if tier.in_place:
        return Response(tier, steps, planned[tier])
    why = "a recovery in place that left out the members stuck there did not recover the task"
    isolated = [e for n in sorted(stalled.stuck_before) for e in isolation(snapshot, n, why, now, limits)]
    stop = StopGeneration(name, snapshot.task(name).generation, limits.failure_stop_grace_s)
    return Response(tier, steps, (*isolated, stop, TaskDown(name, TaskState.RESTARTING)))

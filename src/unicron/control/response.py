"""What the coordinator does about a failure: pure functions of a snapshot, returning effects.

The ladder (``core/ladder.py``) has picked the action; :func:`respond` turns it into effects on
the cluster as the snapshot shows it: isolate the node, then let the survivors go on in place
(they form the next generation without the failed ranks) when that is allowed and possible, or
stop the generation to restart it from its newest checkpoint, or fail the task. The applier
carries the effects out (``effects.Applier.apply``); tests check them on hand-built snapshots.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

from unicron.control.effects import Effect, Isolate, Record, StopGeneration, StopWorker, Switch, TaskDown
from unicron.control.generations import survivors
from unicron.control.snapshot import Snapshot
from unicron.core.ladder import Decision
from unicron.core.settings import Settings
from unicron.core.states import NodeState, TaskState

IN_PROCESS = "in-process recovery"
RESTART_FAILED = "restart of the stuck workers"  # tier two: new processes take peer state
RESTART_FROM_CHECKPOINT = "restart from checkpoint"
TASK_FAILED = "task failed"
TASK_ENDED = "task ended"  # an incident still open when its task ended (finished, cancelled)


@dataclass(frozen=True)
class Failure:
    """An incident as recovery sees it: where it struck and which ranks are known to be gone
    (``failed``: None when they cannot be told apart, so the survivors cannot go on alone)."""

    task: str
    node: str | None
    why: str
    failed: frozenset[int] | None
    incident: int  # the incident's event id, which every effect refers to


@dataclass(frozen=True)
class Response:
    action: str  # IN_PROCESS, RESTART_FROM_CHECKPOINT or TASK_FAILED
    effects: tuple[Effect, ...]


def isolation(snapshot: Snapshot, node: str, why: str, now: float, limits: Settings) -> tuple[Effect, ...]:
    """Take a healthy node out for the isolation period (one that is not healthy stays as it is)."""
    if snapshot.node_state(node) is not NodeState.HEALTHY:
        return ()
    return (Isolate(node, why, now + limits.isolation_s, limits.failure_stop_grace_s),)


def in_place(
    snapshot: Snapshot,
    name: str,
    failed: Collection[int],
    incident: int,
    usable: Callable[[int], bool],
    out: Collection[str] = (),
    replica_size: int = 1,
) -> tuple[Effect, ...] | str:
    """The survivors (on healthy nodes, not in ``out``; whole replicas) rebuild their group as
    the next generation and go on; nothing restarts. The failed ranks still on a healthy node
    are killed (a raising or hung process may linger); the rest of their replicas leave. A
    string says why that is not possible."""
    task = snapshot.task(name)
    healthy = snapshot.healthy() - set(out)
    live = snapshot.live(name)
    shrink = survivors(live, failed, healthy, usable, snapshot.next_generation[name], replica_size)
    if isinstance(shrink, str):
        return shrink
    stops = [StopWorker(w, 0.0) for w in shrink.left if w.rank in failed and w.node in healthy]
    kept = {w: shrink.membership.ranks[w.rank] for w in shrink.kept}
    recovered = Record(
        "in_process_recovery",
        task=name,
        detail={
            "incident": incident,
            "generation": shrink.membership.generation,
            "workers": shrink.membership.world_size,
            "failed": sorted(failed),
            "survivors": [w.rank for w in shrink.kept],
        },
    )
    return (
        *stops,
        Switch(name, task.generation, shrink.membership, kept),
        TaskDown(name, TaskState.STARTING),
        recovered,
    )


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
    """The effects of the ladder's ``decision`` on ``failure``. ``may_stay``: the task recovers
    in place (its spec asks for it and no grow is under way)."""
    name = failure.task
    task = snapshot.task(name)
    effects: list[Effect] = []
    if decision.isolate_node and failure.node is not None:
        why = f"{decision.kind.value} ({decision.why})"
        effects += isolation(snapshot, failure.node, why, now, limits)
    out = {e.node for e in effects if isinstance(e, Isolate)}
    if may_stay and not decision.fail_task and failure.failed is not None:
        stay = in_place(snapshot, name, failure.failed, failure.incident, usable, out, replica_size)
        if not isinstance(stay, str):
            return Response(IN_PROCESS, (*effects, *stay))
        detail = {
            "incident": failure.incident,
            "why": stay,
            "live": [(w.rank, w.node, w.state.value) for w in snapshot.live(name)],
            "failed": sorted(failure.failed),
        }
        effects.append(Record("in_process_impossible", task=name, detail=detail))
    effects.append(StopGeneration(name, task.generation, limits.failure_stop_grace_s))
    if not decision.fail_task:
        return Response(RESTART_FROM_CHECKPOINT, (*effects, TaskDown(name, TaskState.RESTARTING)))
    outcome = {"incident": failure.incident, "outcome": TASK_FAILED, "why": decision.why}
    return Response(
        TASK_FAILED,
        (
            *effects,
            TaskDown(name, TaskState.FAILED, reason=f"{failure.why}: {decision.why}"),
            Record("outcome", task=name, detail=outcome),
        ),
    )

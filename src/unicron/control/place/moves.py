"""What a plan does to each task, as values: a task's move from its members to the workers the
plan gives it (grow or shrink in place, stop and relaunch, launch, or keep), and which of the
plan's parts are carried out now and which wait for slots that processes still hold.

Pure: ``placing.py`` carries the parts out (through the membership changes and the applier) and
holds a plan whose parts wait; tests check the parts on hand-built snapshots.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from unicron.brain.effects import Effect, Launch, Launched, Record, StopGeneration, Stopping
from unicron.brain.membership import Shrink, new_processes, planned_shrink
from unicron.brain.records import TaskRecord, WorkerRecord
from unicron.brain.snapshot import Snapshot
from unicron.control.place.slots import fits
from unicron.core.states import TaskState
from unicron.planning.placement import Assignment
from unicron.planning.planner import Decision as PlanDecision


class MoveKind(Enum):
    KEEP = "keep"  # as it is (or decide later: it is starting, or growing)
    GROW = "grow"  # newcomers join the live members in place
    SHRINK = "shrink"  # the members on the kept nodes go on in place, the others leave
    RESTART = "restart"  # stop at a step boundary with a checkpoint, relaunch as planned
    LAUNCH = "launch"  # not running: a new generation from the checkpoint


@dataclass(frozen=True)
class Move:
    kind: MoveKind
    extra: dict[str, int] = field(default_factory=dict)  # GROW: node -> newcomers
    shrink: Shrink | None = None  # SHRINK: the next generation


def move_for(
    task: TaskRecord,
    after: int,
    wanted: dict[str, int],
    members: Sequence[WorkerRecord],
    in_place: bool,
    growing: bool,
    usable: Callable[[int], bool],
    generation: int,
    in_service: Collection[str] | None = None,
    replica_size: int = 1,
    last_step: int | None = None,
) -> Move:
    """How a task goes from its members to ``after`` workers placed as ``wanted`` (node ->
    count): in place where its recovery mode allows and the placement fits (newcomers only on
    top of the members where they are; a shrink keeping members on the kept nodes), else by a
    restart. ``in_place``: the task recovers in process; ``growing``: newcomers are on the way;
    ``in_service``: the nodes work may stay on (None: all). Members elsewhere (a drained node)
    move off without losing a step: newcomers first join the live replicas where the plan wants
    the task, taking their state from them, then those members leave at a step boundary (they
    leave first where the larger size is not usable). ``last_step``: the task's final step;
    once it is reached no newcomer is added (the members save the final state and leave, and
    newcomers would wait for a step boundary that never comes: the soak's plan grew such a task
    every tick, each grow given up at once). Judged, as a grow's own verdict is
    (``growth_verdict``), by the furthest step the task reached, which a relaunch redoing its
    last steps has reached already."""
    if task.state is TaskState.STARTING:
        return Move(MoveKind.KEEP)  # decide once it runs again (it may be recovering in place)
    if task.state is not TaskState.RUNNING:
        return Move(MoveKind.LAUNCH) if after > 0 else Move(MoveKind.KEEP)
    staying = [w for w in members if in_service is None or w.node in in_service]
    moving_off = len(staying) < len(members)
    if growing or (after == task.workers and not moving_off):
        return Move(MoveKind.KEEP)
    current: dict[str, int] = {}
    for w in staying:
        current[w.node] = current.get(w.node, 0) + 1
    extra = {n: c - current.get(n, 0) for n, c in wanted.items() if c > current.get(n, 0)}
    added = sum(extra.values())
    fits = usable(task.workers + added) if moving_off else added == after - task.workers
    grow = in_place and added and fits and (moving_off or after > task.workers)
    trained = last_step is not None and task.step >= last_step
    if grow and not trained:
        return Move(MoveKind.GROW, extra=extra)
    if grow and not moving_off:
        return Move(MoveKind.KEEP)
    if in_place and (moving_off or 0 < after < task.workers):
        shrink = planned_shrink(members, wanted, usable, generation, replica_size)
        if shrink is not None:
            return Move(MoveKind.SHRINK, shrink=shrink)
    return Move(MoveKind.RESTART)


def wanted_by_task(layout: Assignment, names: Mapping[int, str]) -> dict[str, dict[str, int]]:
    """The plan's layout (node id -> task -> workers) as task -> node name -> workers wanted."""
    wanted: dict[str, dict[str, int]] = {}
    for n, per in sorted(layout.items()):
        for name, count in per.items():
            if count:
                wanted.setdefault(name, {})[names[n]] = count
    return wanted


@dataclass(frozen=True)
class TaskFacts:
    """What a task's spec and state say that its move reads: whether it recovers in process,
    whether newcomers are on the way, which sizes it trains at, its replica size, the nodes
    of its hot spares waiting to be used (a grow takes them before starting new processes),
    and its final step."""

    in_place: bool
    growing: bool
    usable: Callable[[int], bool]
    replica_size: int = 1
    spare_nodes: tuple[str, ...] = ()
    last_step: int | None = None  # the final step (its run's iterations)


@dataclass(frozen=True)
class Part:
    """One task's part of a plan: the plan's decision for it, the workers it wants where, and
    the move that gets it there."""

    decision: PlanDecision
    wanted: dict[str, int]
    move: Move


@dataclass(frozen=True)
class Parts:
    """A plan's parts carried out now, in the plan's order, and the tasks whose new processes
    wait for slots still held (the plan is carried out again once they are free)."""

    now: tuple[Part, ...] = ()
    waiting: tuple[str, ...] = ()


def parts_of(
    decisions: Sequence[PlanDecision],
    wanted: Mapping[str, dict[str, int]],
    snapshot: Snapshot,
    facts: Mapping[str, TaskFacts],
    in_use: Mapping[str, int],
) -> Parts:
    """Each live task's move (``decisions`` may still name a task that ended: a table's answer
    to its end). New processes start only where they fit beside those holding slots (``in_use``,
    node -> processes), counted up as the parts before them start theirs."""
    slots = {n.name: n.slots for n in snapshot.nodes.values()}
    used = dict(in_use)
    now: list[Part] = []
    waiting: list[str] = []
    healthy = snapshot.healthy()
    for decision in decisions:
        name = decision.task
        if name not in snapshot.tasks:
            continue
        task, known, where = snapshot.task(name), facts[name], wanted.get(name, {})
        move = move_for(
            task,
            decision.after,
            where,
            snapshot.live(name),
            in_place=known.in_place,
            growing=known.growing,
            usable=known.usable,
            generation=snapshot.next_generation[name],
            in_service=healthy,
            replica_size=known.replica_size,
            last_step=known.last_step,
        )
        if move.kind in (MoveKind.GROW, MoveKind.LAUNCH):
            spares = list(known.spare_nodes) if move.kind is MoveKind.GROW else []
            new = new_processes(move.extra or where, spares)
            if not fits(new, used, slots):
                waiting.append(name)
                continue
            for node, count in new.items():
                used[node] = used.get(node, 0) + count
        now.append(Part(decision, where, move))
    return Parts(tuple(now), tuple(waiting))


def restart_effects(task: TaskRecord, after: int, reason: str, grace_s: float) -> tuple[Effect, ...]:
    """A task the plan moves by a restart (``MoveKind.RESTART``): its generation stops at a step
    boundary (within ``grace_s``) and it waits to be relaunched at ``after`` workers by a later
    plan; the resize is said."""
    detail = {"before": task.workers, "after": after, "reason": reason}
    return (
        Record("task_resize", task.name, None, detail),
        StopGeneration(task.name, task.generation, grace_s),
        Stopping(task.name),
    )


def launch_effects(
    task: TaskRecord,
    generation: int,
    placement: dict[str, int],
    reason: str,
    argv: Sequence[str],
    env: Mapping[str, str],
) -> tuple[Effect, ...]:
    """A new generation of the task from its checkpoint (``MoveKind.LAUNCH``: the first launch,
    or a relaunch): its workers on ``placement``, ranks in node order, with the task's part of
    their environment ``env`` (which names the store its ``HostStore`` serves, on the task's
    ``store_port``); it is the task's current generation, and the launch is said."""
    world = sum(placement.values())
    detail = {
        "generation": generation,
        "workers": world,
        "placement": placement,
        "resume_from": task.checkpoint_step,
        "reason": reason,
    }
    return (
        Launch(task.name, generation, world, placement, 0, list(argv), dict(env)),
        Launched(task.name, generation, world, task.store_port),
        Record("task_launch", task.name, None, detail),
    )

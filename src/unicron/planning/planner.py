"""The planner: from the cluster's state and an event to the best plan, with reasons.

This is where the cost model meets the solver. For each task it lists the counts it may take
after the event, scores each (WAF over the expected run time, minus the WAF lost while the task
transitions), and lets the solver choose one count per task within the capacity.
"""

from __future__ import annotations

import math
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np

from unicron.core.events import NodeBack, NodeLost, PlanEvent, TaskDone, TasksArrived
from unicron.core.gpus import GpuType
from unicron.core.specs import ClusterSpec, PlannerSettings, TaskSpec
from unicron.planning.costmodel import option_score, run_duration_s, waf
from unicron.planning.placement import Assignment, pack, place
from unicron.planning.solver import Solution, Sweeps, TaskOptions, solve_around
from unicron.planning.throughput import (
    CurvePoints,
    FloatArray,
    ThroughputCurve,
    basis,
    curves_for,
    is_assumed,
)
from unicron.planning.throughput import flops as flops  # formatted there; cli imports it from here
from unicron.planning.transition import transition_parts


@dataclass(frozen=True)
class ClusterState:
    """What the planner knows: healthy nodes, who runs where, the tasks and their curves."""

    gpus_per_node: int
    gpu: GpuType
    node_mtbf_hours: float
    settings: PlannerSettings
    healthy: tuple[int, ...]
    assignment: Mapping[int, Mapping[str, int]]
    tasks: tuple[TaskSpec, ...]
    curves: Mapping[str, ThroughputCurve]
    down: tuple[int, ...] = ()  # nodes out of service, waiting for repair
    next_node: int = 0  # id a new node gets when none is down
    # Submissions queued for the next plan (each one or several tasks submitted together): not
    # yet among ``tasks``; their curves are in ``curves``. A ``TasksArrived`` event adds one.
    arriving: tuple[tuple[TaskSpec, ...], ...] = ()

    def arrival(self, event: TasksArrived) -> tuple[TaskSpec, ...]:
        """The queued submission ``event`` names."""
        for group in self.arriving:
            if tuple(t.name for t in group) == event.tasks:
                return group
        raise KeyError(f"no queued submission of {', '.join(event.tasks)}")

    @property
    def known_tasks(self) -> tuple[TaskSpec, ...]:
        """The tasks, then the queued submissions' tasks."""
        return self.tasks + tuple(t for group in self.arriving for t in group)

    @property
    def replica_sizes(self) -> dict[str, int]:
        """Each task's replica size: its workers are placed in whole replicas."""
        return {t.name: t.replica_size for t in self.known_tasks}

    def returning_node(self, event: NodeBack | None = None) -> int:
        """The node a ``node-back`` event brings: the one named, else the longest-down one,
        else a new one."""
        if event is not None and event.node is not None:
            return event.node
        return self.down[0] if self.down else self.next_node

    @classmethod
    def from_specs(
        cls,
        cluster: ClusterSpec,
        tasks: list[TaskSpec],
        measured: Mapping[str, Mapping[int, float]] | None = None,
    ) -> ClusterState:
        gpu = cluster.gpu_type()
        nodes = tuple(range(cluster.nodes))
        assignment: Assignment
        if cluster.assignment:
            assignment = {n: dict(t) for n, t in cluster.assignment.items()}
        else:
            wanted = {t.name: t.current_workers for t in tasks if t.current_workers}
            if sum(wanted.values()) > cluster.total_gpus:
                raise ValueError(
                    f"current_workers add up to {sum(wanted.values())} GPUs, "
                    f"the cluster has {cluster.total_gpus}"
                )
            assignment = pack(wanted, nodes, cluster.gpus_per_node, {t.name: t.replica_size for t in tasks})
        curves = curves_for(tasks, gpu, cluster.gpus_per_node, measured or {})
        return cls(
            cluster.gpus_per_node,
            gpu,
            cluster.node_mtbf_hours,
            cluster.planner,
            nodes,
            assignment,
            tuple(tasks),
            curves,
            next_node=cluster.nodes,
        )

    @property
    def capacity(self) -> int:
        return len(self.healthy) * self.gpus_per_node

    @cached_property
    def _workers(self) -> dict[str, int]:
        healthy = set(self.healthy)
        totals: dict[str, int] = {}
        for node, tasks in self.assignment.items():
            if node in healthy:
                for name, gpus in tasks.items():
                    totals[name] = totals.get(name, 0) + gpus
        return totals

    def workers(self, task: str) -> int:
        """GPUs the task holds on nodes in service."""
        return self._workers.get(task, 0)

    def unit(self) -> int:
        """GPUs per planning unit. ``auto`` is exact: the gcd of node size and every task's step."""
        mode = self.settings.granularity
        if mode == "gpu":
            return 1
        if mode == "node":
            return self.gpus_per_node
        unit = self.gpus_per_node
        for task in self.known_tasks:
            counts = list(task.throughput) if task.throughput is not None else [task.step]
            for count in counts:
                unit = math.gcd(unit, count)
        return unit


@dataclass(frozen=True)
class Decision:
    task: str
    weight: float
    before: int
    after: int
    waf_before: float
    waf_after: float
    transition_s: float
    hit: bool
    reason: str = ""


@dataclass(frozen=True)
class Plan:
    event: str
    decisions: tuple[Decision, ...]
    objective: float  # plan score, FLOP (weighted)
    waf: float  # cluster WAF of the plan, FLOP/s
    capacity_gpus: int
    run_duration_s: float
    unit_gpus: int
    solve_s: float = field(compare=False, default=0.0)

    def allocation(self) -> dict[str, int]:
        return {d.task: d.after for d in self.decisions}

    def changed(self) -> list[Decision]:
        return [d for d in self.decisions if d.after != d.before or d.hit]


@dataclass(frozen=True)
class _Situation:
    """The cluster right after an event, before anything is moved."""

    event: str
    nodes: tuple[int, ...]
    tasks: tuple[TaskSpec, ...]
    current: dict[str, int]
    survivors: dict[str, int]
    failed: frozenset[str]
    finished: tuple[str, ...]
    drained: bool = False  # the node left by an admin's drain, not by a failure


def _situation(state: ClusterState, event: PlanEvent | None) -> _Situation:
    current = {t.name: state.workers(t.name) for t in state.tasks}
    survivors = dict(current)
    nodes, failed = state.healthy, frozenset[str]()
    finished: tuple[str, ...] = ()
    tasks = state.tasks
    if isinstance(event, NodeLost):
        if event.node not in state.healthy:
            raise KeyError(f"node {event.node} is not in service")
        nodes = tuple(n for n in state.healthy if n != event.node)
        lost = state.assignment.get(event.node, {})
        for name, gpus in lost.items():
            survivors[name] -= gpus
        failed = frozenset(lost)
    elif isinstance(event, NodeBack):
        back = state.returning_node(event)
        if back in state.healthy:
            raise KeyError(f"node {back} is already in service")
        nodes = (*state.healthy, back)
    elif isinstance(event, TaskDone):
        if event.task not in current:
            raise KeyError(f"task {event.task!r} is not known")
        tasks = tuple(t for t in state.tasks if t.name != event.task)
        finished = (event.task,)
    elif isinstance(event, TasksArrived):
        group = state.arrival(event)
        tasks = (*state.tasks, *group)
        current.update({t.name: 0 for t in group})
        survivors.update({t.name: 0 for t in group})
    drained = isinstance(event, NodeLost) and event.drained
    return _Situation(
        str(event) if event else "now", nodes, tasks, current, survivors, failed, finished, drained
    )


def _candidates(task: TaskSpec, unit: int, capacity: int) -> np.ndarray:
    """Counts (GPUs) a task may take: usable, multiples of the unit, within capacity."""
    top = min(capacity, task.max_workers or capacity)
    if task.throughput is not None:
        counts = [c for c in task.throughput if c <= top and c % unit == 0 and task.is_usable(c)]
        return np.array(sorted(counts), dtype=np.int64)
    step = math.lcm(unit, task.step)
    first = max(step, -(-task.minimum // step) * step)
    return np.arange(first, top + 1, step, dtype=np.int64)


@dataclass(frozen=True)
class _TaskChoices:
    task: TaskSpec
    current: int
    waf_before: float
    points: CurvePoints  # candidate counts, current first, then 0, then ascending
    transition_s: FloatArray
    options: TaskOptions


@dataclass(frozen=True)
class _Problem:
    situation: _Situation
    unit: int
    capacity: int
    run_s: float
    choices: tuple[_TaskChoices, ...]


ChoiceKey = tuple[str, int, int, bool, int, float]  # task, current, survivors, failed, capacity, run


@dataclass
class PlanCache:
    """What plans for one state share (``plantable.build`` keeps one for all its events): each
    task's options, by what they depend on, and the solver's sweeps over each event class's
    base problem (``solver.Sweeps``), so an event redoes only the tasks it changes."""

    choices: dict[ChoiceKey, _TaskChoices] = field(default_factory=dict)
    sweeps: dict[str, tuple[tuple[_TaskChoices, ...], Sweeps]] = field(default_factory=dict)


def _task_choices(
    state: ClusterState, task: TaskSpec, key: ChoiceKey, unit: int, cache: PlanCache
) -> _TaskChoices:
    found = cache.choices.get(key)
    if found is not None:
        return found
    _, current, survivors, failed, capacity, run_s = key
    counts = _candidates(task, unit, capacity)
    points = state.curves[task.name].evaluate(
        np.concatenate([np.array([0, current], dtype=np.int64), counts])
    )
    before = points.take([1])
    waf_before = float(waf(task.weight, before.rate)[0]) if current else 0.0
    usable = np.flatnonzero(points.rate[2:] > 0) + 2
    # Option order matters for ties: the current count first, then 0, then ascending.
    order = [i for i in usable if points.gpus[i] == current] + [0]
    order += [i for i in usable if points.gpus[i] != current]
    chosen = points.take([int(i) for i in order])
    trans = transition_parts(
        state.settings.transition,
        before=before,
        after=chosen,
        survivors=survivors,
        failed=failed,
        detection_s=state.settings.transition.node_loss_detection_s,
    ).total
    changed = (chosen.gpus != current) | failed
    score = option_score(waf(task.weight, chosen.rate), waf_before, run_s, trans, changed)
    made = _TaskChoices(
        task, current, waf_before, chosen, trans, TaskOptions(chosen.gpus // unit, score, changed)
    )
    cache.choices[key] = made
    return made


def _problem(state: ClusterState, event: PlanEvent | None, cache: PlanCache | None = None) -> _Problem:
    cache = cache if cache is not None else PlanCache()
    sit = _situation(state, event)
    unit = state.unit()
    capacity = len(sit.nodes) * state.gpus_per_node
    run_s = run_duration_s(len(sit.nodes), state.node_mtbf_hours)
    choices = []
    for task in sit.tasks:
        current, survivors = sit.current[task.name], sit.survivors[task.name]
        key = (task.name, current, survivors, task.name in sit.failed, capacity, run_s)
        choices.append(_task_choices(state, task, key, unit, cache))
    return _Problem(sit, unit, capacity, run_s, tuple(choices))


def _solve(state: ClusterState, event: PlanEvent | None, problem: _Problem, cache: PlanCache) -> Solution:
    """The solver's answer, as the event's class's base problem with the tasks the event
    changes redone: events of one class (every node loss; the present, a task done and an
    arrival; a node back) share their base's sweeps. A lone plan does the same, so a table's
    plan and a fresh one are the same plan."""
    klass = "lost" if isinstance(event, NodeLost) else "back" if isinstance(event, NodeBack) else "now"
    if klass not in cache.sweeps:
        if klass == "lost":  # the loss of a node that hits no task: the others' options
            nodes = len(state.healthy) - 1
            capacity, run_s = nodes * state.gpus_per_node, run_duration_s(nodes, state.node_mtbf_hours)
            keys = [
                (t.name, state.workers(t.name), state.workers(t.name), False, capacity, run_s)
                for t in state.tasks
            ]
            base = tuple(
                _task_choices(state, t, k, problem.unit, cache)
                for t, k in zip(state.tasks, keys, strict=True)
            )
        else:
            base = (problem if klass == "back" else _problem(state, None, cache)).choices
        units = problem.capacity // problem.unit
        cache.sweeps[klass] = (base, Sweeps([c.options for c in base], units))
    base, sweeps = cache.sweeps[klass]
    by_name = {c.task.name: c for c in problem.choices}
    replaced: dict[int, TaskOptions | None] = {}
    for i, c in enumerate(base):
        now = by_name.pop(c.task.name, None)
        if now is not c:
            replaced[i] = now.options if now is not None else None
    return solve_around(sweeps, replaced, [c.options for c in by_name.values()])


def plan(state: ClusterState, event: PlanEvent | None = None, cache: PlanCache | None = None) -> Plan:
    """The best plan for the cluster right after ``event`` (or now, with no event); ``cache``:
    shared by plans for one state (``PlanCache``)."""
    started = time.perf_counter()
    cache = cache if cache is not None else PlanCache()
    problem = _problem(state, event, cache)
    sit = problem.situation
    solution = _solve(state, event, problem, cache)
    decisions = []
    for c, pick in zip(problem.choices, solution.picks, strict=True):
        after = int(c.points.gpus[pick])
        failed = c.task.name in sit.failed
        changed = after != c.current or failed
        decisions.append(
            Decision(
                c.task.name,
                c.task.weight,
                c.current,
                after,
                c.waf_before,
                float(c.task.weight * c.points.rate[pick]),
                float(c.transition_s[pick]) if changed else 0.0,
                failed,
            )
        )
    for name in sit.finished:
        spec = next(t for t in state.tasks if t.name == name)
        decisions.append(Decision(name, spec.weight, sit.current[name], 0, 0.0, 0.0, 0.0, False))
    decisions = _explain(decisions, sit, problem.capacity, state)
    return Plan(
        sit.event,
        tuple(decisions),
        solution.score,
        sum(d.waf_after for d in decisions),
        problem.capacity,
        problem.run_s,
        problem.unit,
        time.perf_counter() - started,
    )


def explained(chosen: Plan, state: ClusterState, event: PlanEvent) -> Plan:
    """``chosen`` (planned for ``event`` from ``state``) with its reasons given anew for how
    ``event`` is told: a drain's plan is a loss's, said in a drain's words."""
    sit = _situation(state, event)
    decisions = _explain([replace(d, reason="") for d in chosen.decisions], sit, chosen.capacity_gpus, state)
    return replace(chosen, event=sit.event, decisions=tuple(decisions))


def restated(chosen: Plan, state: ClusterState) -> Plan:
    """``chosen`` (a table's plan, for the state the table was built from) with the decisions of
    the tasks a recovery resized since said anew from the workers they hold now in ``state``: a
    task that survived a crash on fewer workers and gets its count back grows, it is not
    "unchanged". The event's own decisions (a task it hit, one it finished) keep their words."""
    # Said among the tasks the cluster has now (whose GPUs serve whom): a task the event
    # finished is in the plan, but no longer in ``state`` (nor its curve).
    names = {t.name for t in state.tasks} & set(state.curves)
    moved = {
        d.task
        for d in chosen.decisions
        if d.task in names and not d.hit and d.before != state.workers(d.task)
    }
    if not moved:
        return chosen
    now = [_from_now(d, state) if d.task in moved else d for d in chosen.decisions]
    among = [d for d in now if d.task in names]
    said = {d.task: d for d in _explain(among, _situation(state, None), chosen.capacity_gpus, state, moved)}
    return replace(chosen, decisions=tuple(said.get(d.task, d) for d in now))


def _from_now(decision: Decision, state: ClusterState) -> Decision:
    """``decision`` from the workers its task holds in ``state``, at their weighted rate."""
    held = state.workers(decision.task)
    rate = state.curves[decision.task].evaluate(np.array([held], dtype=np.int64)).rate
    waf_now = float(waf(decision.weight, rate)[0]) if held else 0.0
    return replace(decision, before=held, waf_before=waf_now)


def feasible_allocations(state: ClusterState, event: PlanEvent | None = None) -> list[list[int]]:
    """Per task (in order), every count it may take after ``event``: for checks and baselines."""
    return [[int(g) for g in c.points.gpus] for c in _problem(state, event).choices]


def score_allocation(state: ClusterState, event: PlanEvent | None, allocation: Mapping[str, int]) -> float:
    """The plan score of any allocation, straight from the cost model (no search).

    Raises ValueError for an infeasible allocation (unusable count or over capacity).
    """
    problem = _problem(state, event)
    if sum(allocation.get(c.task.name, 0) for c in problem.choices) > problem.capacity:
        raise ValueError("allocation exceeds the capacity")
    total = 0.0
    for c in problem.choices:
        count = allocation.get(c.task.name, 0)
        index = np.flatnonzero(c.points.gpus == count)
        if len(index) == 0:
            raise ValueError(f"{count} is not a usable count for {c.task.name}")
        total += float(c.options.score[index[0]])
    return total


def _explain(
    decisions: list[Decision],
    sit: _Situation,
    capacity: int,
    state: ClusterState,
    only: Collection[str] | None = None,
) -> list[Decision]:
    """A short reason for each decision (``only``: for those of these tasks, the others left out),
    in the terms a user reasons in, each said among all ``decisions``."""
    # Who the freed GPUs serve: tasks that end with more workers than survived the event.
    gainers = [d.task for d in decisions if d.after > sit.survivors.get(d.task, 0)]
    used = sum(d.after for d in decisions)
    specs = {t.name: t for t in state.known_tasks}
    out = []
    for d in decisions:
        if only is not None and d.task not in only:
            continue
        lost = sit.current.get(d.task, 0) - sit.survivors.get(d.task, 0)
        off = f"moves {lost} GPUs off the drained node" if sit.drained else f"lost {lost} GPUs with the node"
        if d.task in sit.finished:
            why = f"finished; frees {d.before} GPUs"
        elif d.hit and d.after == d.before:
            why = f"{off}; replaced on healthy GPUs"
        elif d.hit and d.after > d.before:
            why = f"{off}; replaced, and grows to {d.after}"
        elif d.hit and d.after > 0:
            why = f"{off}; goes on with {d.after}"
        elif d.hit:
            why = f"{off}; waits for capacity"
        elif d.after == d.before == 0:
            minimum = specs[d.task].minimum
            if minimum > capacity:
                why = f"waits: needs at least {minimum} GPUs, the cluster has {capacity}"
            elif minimum > capacity - used:
                why = f"waits: needs {minimum} GPUs; they yield more WAF in other tasks"
            else:
                why = "waits: no usable count fits (memory or batch size)"
        elif d.after == d.before:
            why = "unchanged"
        elif d.before == 0:
            why = f"starts on {d.after} GPUs"
        elif d.after > d.before:
            why = f"grows by {d.after - d.before} GPUs (+{flops(d.waf_after - d.waf_before)} weighted)"
        elif d.after == 0:
            why = f"stops (all {d.before} GPUs; it restarts from its checkpoint when planned again): "
            why += _stopped_for(d, [e for e in decisions if e.task in gainers and e.task != d.task], state)
        else:
            to = ", ".join(g for g in gainers if g != d.task) or "no task (spares)"
            why = f"shrinks by {d.before - d.after} GPUs, which serve {to} better"
        if d.before and not d.waf_before and d.task not in sit.finished:
            why = f"{d.before} GPUs was not a usable count (memory or batch split); {why}"
        curve = state.curves.get(d.task)
        if curve is not None and is_assumed(curve) and d.task not in sit.finished and basis(curve) not in why:
            why = f"{why} ({basis(curve)})"  # planned on an assumption: say so, and which
        out.append(replace(d, reason=why))
    return out


def _stopped_for(stopped: Decision, gainers: list[Decision], state: ClusterState) -> str:
    """Why a running task gives all its GPUs away: the weighted rates compared, and where each
    comes from (measured, or declared), so that a user can tell a guess from a measurement."""
    mine = f"{flops(stopped.waf_before)} weighted ({basis(state.curves[stopped.task])})"
    if not gainers:
        return f"its {mine} is worth less than its transition or a spare's"
    theirs = ", ".join(
        f"{g.task} on {g.after} GPUs {flops(g.waf_after)} weighted ({basis(state.curves[g.task])})"
        for g in gainers
    )
    return f"its GPUs serve {theirs} better than its own {mine}"


def advance(state: ClusterState, event: PlanEvent | None, chosen: Plan) -> ClusterState:
    """The state after ``event`` happened and ``chosen`` was carried out."""
    sit = _situation(state, event)
    previous = {n: dict(t) for n, t in state.assignment.items() if n in sit.nodes}
    assignment = place(chosen.allocation(), sit.nodes, state.gpus_per_node, previous, state.replica_sizes)
    down, next_node = state.down, state.next_node
    if isinstance(event, NodeLost):
        down = (*down, event.node)
    elif isinstance(event, NodeBack):
        back = state.returning_node(event)
        down = tuple(n for n in down if n != back)
        next_node = max(next_node, back + 1)
    curves = {k: v for k, v in state.curves.items() if k not in sit.finished}
    arriving = state.arriving
    if isinstance(event, TasksArrived):
        arriving = tuple(g for g in arriving if tuple(t.name for t in g) != event.tasks)
    return replace(
        state,
        arriving=arriving,
        healthy=sit.nodes,
        assignment=assignment,
        tasks=sit.tasks,
        curves=curves,
        down=down,
        next_node=next_node,
    )

"""The planner through the cost model: optimal, feasible, stable, and answered by lookup."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unicron.core.events import NodeBack, NodeLost, PlanEvent, TaskDone
from unicron.core.specs import ClusterSpec, TaskSpec, parse_cluster, parse_tasks
from unicron.planning.placement import Assignment, CarriedPlacement, node_unit, place
from unicron.planning.planner import (
    ClusterState,
    feasible_allocations,
    plan,
    score_allocation,
)
from unicron.planning.plantable import build, refresh


@st.composite
def small_clusters(draw: st.DrawFn) -> tuple[ClusterState, PlanEvent | None]:
    per_node = draw(st.sampled_from([2, 4]))
    nodes = draw(st.integers(1, 3))
    cluster = ClusterSpec(
        nodes=nodes,
        gpus_per_node=per_node,
        gpu="A100",
        node_mtbf_hours=draw(st.sampled_from([0.5, 10.0, 1000.0])),
    )
    tasks = []
    for i in range(draw(st.integers(1, 3))):
        counts = draw(st.lists(st.integers(1, nodes * per_node + 2), min_size=1, max_size=4, unique=True))
        table = {c: draw(st.floats(1e12, 1e15)) * c for c in counts}
        tasks.append(
            TaskSpec(
                name=f"t{i}",
                weight=draw(st.sampled_from([0.5, 1.0, 3.0])),
                throughput=table,
                state_bytes=draw(st.sampled_from([0.0, 1e12])),
                iteration_seconds=1.0,
            )
        )
    state = ClusterState.from_specs(cluster, tasks)
    # Start from some feasible allocation so that events hit running tasks.
    start = {}
    free = state.capacity
    for task in tasks:
        fits = [c for c in sorted(task.throughput or {}) if c <= free]
        pick = draw(st.sampled_from([0, *fits]))
        start[task.name] = pick
        free -= pick
    state = ClusterState(
        state.gpus_per_node,
        state.gpu,
        state.node_mtbf_hours,
        state.settings,
        state.healthy,
        place(start, state.healthy, per_node, {}),
        state.tasks,
        state.curves,
        next_node=nodes,
    )
    events: list[PlanEvent | None] = [None, NodeBack(), *(NodeLost(n) for n in state.healthy)]
    events += [TaskDone(t.name) for t in tasks]
    return state, draw(st.sampled_from(events))


@settings(max_examples=150, deadline=None)
@given(small_clusters())
def test_plan_is_optimal_and_feasible(case: tuple[ClusterState, PlanEvent | None]) -> None:
    state, event = case
    if isinstance(event, NodeLost) and len(state.healthy) == 1:
        return
    chosen = plan(state, event)
    options = feasible_allocations(state, event)
    names = [t.name for t in state.tasks if not (isinstance(event, TaskDone) and t.name == event.task)]
    best = max(
        score_allocation(state, event, dict(zip(names, combo, strict=True)))
        for combo in itertools.product(*options)
        if sum(combo) <= chosen.capacity_gpus
    )
    assert chosen.objective == pytest.approx(best, rel=1e-9, abs=1e-6)
    allocation = chosen.allocation()
    assert sum(allocation.values()) <= chosen.capacity_gpus
    for name, opts in zip(names, options, strict=True):
        assert allocation[name] in opts
    for spec in state.tasks:
        count = allocation[spec.name]
        assert count == 0 or spec.is_usable(count)


def example_state(examples: Path) -> ClusterState:
    cluster = parse_cluster((examples / "cluster-128.yaml").read_text())
    tasks = parse_tasks((examples / "tasks-gpt3.yaml").read_text())
    return ClusterState.from_specs(cluster, tasks)


def test_table_lookups_equal_fresh_solves(examples: Path) -> None:
    state = example_state(examples)
    table = build(state)
    for event in [NodeLost(0), NodeLost(9), NodeLost(15), NodeBack(), TaskDone("gpt3-13b")]:
        looked_up = table.lookup(event)
        fresh = plan(state, event)
        assert looked_up.event == str(event)
        assert looked_up.allocation() == fresh.allocation()
        assert looked_up.objective == pytest.approx(fresh.objective)


def test_node_loss_marks_hit_tasks_and_shrinks_capacity(examples: Path) -> None:
    state = example_state(examples)
    lost = plan(state, NodeLost(0))
    hit = {d.task for d in lost.decisions if d.hit}
    assert hit == set(state.assignment[0])
    assert lost.capacity_gpus == state.capacity - state.gpus_per_node
    assert lost.run_duration_s > plan(state).run_duration_s  # fewer nodes fail less often


def test_refresh_applies_the_plan_and_is_stable(examples: Path) -> None:
    table = build(example_state(examples))
    for event in [None, NodeLost(3), NodeBack(), TaskDone("gpt3-1.3b")]:
        expected = table.now if event is None else table.lookup(event)
        table = refresh(table, event)
        state = table.state
        assert {t.name: state.workers(t.name) for t in state.tasks} == {
            k: v for k, v in expected.allocation().items() if k in state.curves
        }
        # Having carried out the optimal plan, the best plan for the present is to stay put.
        assert table.now.changed() == []
    assert table.state.down == ()  # the lost node came back


def test_ties_prefer_fewer_changes() -> None:
    cluster = ClusterSpec(nodes=1, gpus_per_node=8, gpu="A100", node_mtbf_hours=1e6)
    twins = [
        TaskSpec(name=n, weight=1, throughput={4: 1e15, 8: 2e15}, current_workers=c)
        for n, c in (("a", 4), ("b", 4))
    ]
    state = ClusterState.from_specs(cluster, twins)
    # a:8 or b:8 would score the same as a:4 + b:4 without transition costs; staying wins.
    assert plan(state).allocation() == {"a": 4, "b": 4}


def test_auto_granularity_is_exact() -> None:
    cluster = ClusterSpec(nodes=4, gpus_per_node=8, gpu="A100", node_mtbf_hours=100)
    tasks = [
        TaskSpec(name="a", weight=1, throughput={8: 1e15, 16: 1.9e15}),
        TaskSpec(name="b", weight=1, throughput={12: 1e15}),
    ]
    assert ClusterState.from_specs(cluster, tasks).unit() == 4


def test_placement_keeps_workers_in_place() -> None:
    previous = {0: {"a": 8}, 1: {"a": 4, "b": 4}, 2: {"b": 8}}
    after = place({"a": 8, "b": 16}, [0, 1, 2, 3], 8, previous)
    assert after[0] == {"a": 8} and after[2] == {"b": 8}
    assert sum(g for n in after.values() for g in n.values()) == 24
    # Only b's 4 new workers start somewhere new: a keeps node 0, b keeps nodes 1 and 2.
    assert after.get(1, {}).get("a", 0) + after.get(3, {}).get("a", 0) == 0
    with pytest.raises(ValueError):
        place({"a": 40}, [0, 1], 8, {})


@st.composite
def placements(draw: st.DrawFn) -> tuple[dict[str, int], list[int], int, Assignment, dict[str, int] | None]:
    """A placement's inputs: counts that fit, nodes in any order, a previous assignment over
    some of them and some out of service, and sometimes replicas of several workers (sizes the
    task file allows: dividing the node or spanning whole nodes; each task's count then in
    whole units, as the planner gives them)."""
    size = draw(st.sampled_from([1, 2, 4, 8]))
    nodes = draw(st.lists(st.integers(0, 60), min_size=1, max_size=24, unique=True))
    tasks = [f"t{i}" for i in range(draw(st.integers(1, 5)))]
    sizes = draw(st.none() | st.fixed_dictionaries({t: st.sampled_from([1, 2, 4, 8, 16]) for t in tasks}))
    units = {t: node_unit((sizes or {}).get(t, 1), size) for t in tasks}  # (the planner's counts are whole)
    counts = {t: units[t] * draw(st.integers(0, len(nodes) * size // units[t])) for t in tasks}
    while sum(counts.values()) > len(nodes) * size:
        biggest = max(counts, key=counts.__getitem__)
        counts[biggest] -= units[biggest]
    previous: Assignment = {}
    for node in draw(st.lists(st.sampled_from([*nodes, 61, 62]), unique=True)):
        free, row = size, {}
        for task in draw(st.lists(st.sampled_from(tasks), unique=True)):
            if free:
                row[task] = draw(st.integers(1, free))
                free -= row[task]
        previous[node] = row
    return counts, nodes, size, previous, sizes


@given(placements())
@settings(max_examples=300, deadline=None)
def test_a_placement_gives_each_task_its_count_in_whole_units_keeping_what_may_stay(
    inputs: tuple[dict[str, int], list[int], int, Assignment, dict[str, int] | None],
) -> None:
    """What any placement keeps to: each task gets its count, in whole units on each node, on
    nodes in service within their slots, the nodes in the order given; a task of single workers
    keeps every worker it had on a node still in service, up to its count. (Replica sizes that
    divide the node or span whole nodes, as the task file allows, always pack: whole units
    that divide each other, largest first.)"""
    counts, nodes, size, previous, sizes = inputs
    after = place(counts, nodes, size, previous, sizes)
    assert list(after) == [n for n in nodes if n in after]
    for node, row in after.items():
        assert row and all(g > 0 for g in row.values()) and sum(row.values()) <= size
        for task, g in row.items():
            assert g % node_unit((sizes or {}).get(task, 1), size) == 0, (node, task, g)
    placed = {t: sum(r.get(t, 0) for r in after.values()) for t in counts}
    assert placed == counts
    if sizes is None:
        for task, count in counts.items():
            had = sum(r.get(task, 0) for n, r in previous.items() if n in nodes)
            kept = sum(min(r.get(task, 0), after.get(n, {}).get(task, 0)) for n, r in previous.items())
            assert kept == min(had, count), (task, had, kept, count)


@st.composite
def placement_events(draw: st.DrawFn) -> tuple[int, int, list[tuple[str, int, dict[str, int]]]]:
    """A cluster (nodes, slots) and events as the simulator has them: a node taken out of
    service (its row dropped), a node back, new counts (fitting what is in service)."""
    nodes, size = draw(st.integers(1, 24)), draw(st.sampled_from([1, 2, 4, 8]))
    events = []
    for _ in range(draw(st.integers(1, 25))):
        kind = draw(st.sampled_from(["out", "back", "counts", "counts"]))
        node = draw(st.integers(0, nodes - 1))
        counts = {t: draw(st.integers(0, nodes * size)) for t in ("a", "b", "c")[: draw(st.integers(1, 3))]}
        events.append((kind, node, counts))
    return nodes, size, events


@given(placement_events())
@settings(max_examples=300, deadline=None)
def test_a_carried_placement_gives_what_a_placement_afresh_gives(
    inputs: tuple[int, int, list[tuple[str, int, dict[str, int]]]],
) -> None:
    """The simulator's ``CarriedPlacement`` (the last layout carried on) places as ``place``
    does from the same previous placement, after each event of a sequence: the same nodes in
    the same order, the same tasks in each row in the same order."""
    nodes, size, events = inputs
    healthy, carried, assignment = set(range(nodes)), CarriedPlacement(), {}
    for kind, node, wanted in events:
        if kind == "out" and len(healthy) > 1:
            healthy.discard(node)
            assignment.pop(node, None)
        elif kind == "back":
            healthy.add(node)
        left, counts = len(healthy) * size, {}
        for task, count in wanted.items():  # (what is in service holds them all)
            counts[task] = min(count, left)
            left -= counts[task]
        expected = place(counts, sorted(healthy), size, {n: dict(r) for n, r in assignment.items()})
        assignment = carried.place(counts, sorted(healthy), size, assignment)
        assert [(n, list(r.items())) for n, r in assignment.items()] == [
            (n, list(r.items())) for n, r in expected.items()
        ]

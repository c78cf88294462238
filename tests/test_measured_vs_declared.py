"""Measured and declared throughput are compared like for like.

Seen on the live stack: two tasks of weight 1 declaring the same table ``{4: 3.6e9}`` on 4
slots. The running one was measured at 0.38 GFLOP/s (rates.py: whole-task FLOP/s, unweighted);
the waiting one had only its declaration, 3.6e9. The planner compared the two
(placing.py built a MeasuredCurve for one and a TableCurve for the other) and stopped the
running task for the waiting one, whose declaration is as optimistic as the first one's was
(it runs the same program). The stopped task waited ~25 s and was relaunched from its
checkpoint. Now an unmeasured task's estimate is put on the level the cluster measures
(``throughput.calibration``). These tests build the planner's inputs by hand, as
``Placer.cluster_state`` does.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import pytest

from unicron.control.place.rates import RateMeter
from unicron.core.livespecs import DEFAULT_LIVE_CLUSTER, LiveTaskSpec, parse_live_tasks
from unicron.planning.planner import ClusterState, plan
from unicron.planning.throughput import curves_for

SLOTS = 2  # two nodes of two slots: 4 in all


def spec(name: str, table: str, weight: float = 1) -> LiveTaskSpec:
    return parse_live_tasks(
        f"name: {name}\nweight: {weight}\nthroughput: {table}\n"
        "run: {program: [python, t.py], iterations: 100, flops_per_sample: 1.0e7}\n"
    )[0]


def state(
    tasks: list[LiveTaskSpec],
    assignment: Mapping[int, Mapping[str, int]],
    measured: Mapping[str, Mapping[int, float]],
) -> ClusterState:
    """What ``Placer.cluster_state`` hands the planner (placing.py: curves_for with the meter's rates)."""
    hardware = DEFAULT_LIVE_CLUSTER
    gpu = hardware.gpu_type()
    curves = curves_for(tasks, gpu, SLOTS, measured)
    return ClusterState(
        SLOTS,
        gpu,
        hardware.node_mtbf_hours,
        hardware.planner,
        (0, 1),
        assignment,
        tuple(tasks),
        curves,
        next_node=2,
    )


def test_measured_rates_are_whole_task_flops_like_the_declared_table() -> None:
    """The units agree: 4 ranks x 8 samples a step, a step a second, 1e7 FLOP a sample is
    3.2e8 FLOP/s for the task at 4 workers (not per worker, not weighted)."""
    meter = RateMeter(window_s=5.0, skip=0, min_steps=2)
    for step in range(1, 12):
        for rank in range(4):
            meter.report("a", 1, 4, step, rank, 8, 100.0 + step, flops_per_sample=1e7)
    assert meter.measured("a") == {4: pytest.approx(3.2e8)}


def test_a_measured_task_is_not_stopped_for_a_declared_one_of_the_same_program() -> None:
    """The live case: a runs on all 4 slots, measured at 0.38 GFLOP/s; b (same table, same
    weight) waits. Nothing says b would do better than a, so a keeps its slots. Before: the
    plan compared 0.38e9 (measured) with 3.6e9 (declared) and stopped a for b."""
    a, b = spec("a", "{4: 3.6e9}"), spec("b", "{4: 3.6e9}")
    running = {0: {"a": 2}, 1: {"a": 2}}
    chosen = plan(state([a, b], running, {"a": {4: 0.38e9}})).allocation()
    assert chosen == {"a": 4, "b": 0}, chosen


def test_a_first_measurement_does_not_hand_a_tasks_slots_to_its_unmeasured_twin() -> None:
    """Two equal tasks share 4 slots 2 + 2 (declared: 2.0e9 each beats 3.6e9 for one on 4).
    a's measurement arrives first, 10x below its declaration: the same split must stay best,
    as it is when both are declared, or both measured at the same ratio. Before: a was stopped
    and b given 4 slots (3.6e9 declared against 0.19e9 + 2.0e9)."""
    a, b = spec("a", "{2: 2.0e9, 4: 3.6e9}"), spec("b", "{2: 2.0e9, 4: 3.6e9}")
    shared = {0: {"a": 2}, 1: {"b": 2}}
    declared = plan(state([a, b], shared, {})).allocation()
    both = plan(state([a, b], shared, {"a": {2: 0.19e9}, "b": {2: 0.19e9}})).allocation()
    one = plan(state([a, b], shared, {"a": {2: 0.19e9}})).allocation()
    assert declared == both == {"a": 2, "b": 2}
    assert one == declared, one


def test_a_plan_that_takes_all_of_a_running_tasks_workers_says_why() -> None:
    """Stopping a running task (it restarts later from its checkpoint) is the costliest move
    a plan makes: its reason says that it stops, for whom, and on what rates (measured or
    declared). Here b is worth 5x as much, so stopping a is right; the reason must say so."""
    a, b = spec("a", "{4: 3.6e9}"), spec("b", "{4: 3.6e9}", weight=5)
    running = {0: {"a": 2}, 1: {"a": 2}}
    decided = plan(state([a, b], running, {"a": {4: 0.38e9}}))
    assert decided.allocation() == {"a": 0, "b": 4}
    (reason,) = [d.reason for d in decided.decisions if d.task == "a"]
    for word in ("stop", "b", "measured", "declared"):
        assert re.search(rf"\b{word}", reason.lower()), reason

"""A live task needs no invented planner numbers (issue 51 point 8).

A task file without ``throughput`` (and without ``model``) is accepted. Until its first steps
are measured it is planned on an assumed curve, linear in its GPUs at an assumed rate per GPU
(``planning.throughput.assumed_rate``): what this cluster's measured tasks achieve per GPU; with
none, what the other tasks' tables declare per GPU; with none, ``ASSUMED_PEAK_FRACTION`` of the
GPU's peak. Every plan reason of such a task says "not measured yet" and what it assumed. Once
the coordinator measures it (``RateMeter``), the plan table is rebuilt with the measured rate at
that size and the assumed curve scaled through it elsewhere. A task whose FLOPs per sample are
unknown is measured in samples/s: its scaling, on the assumed level. ``run.iterations`` is the one
count of a task's steps: ``run.env`` may not set it again.

The planner's inputs are built by hand as ``Placer.cluster_state`` builds them (as in
tests/test_measured_vs_declared.py); the coordinator is stepped by hand (tests/fakecluster.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from unicron.control.coordinator import Coordinator, CoordinatorSettings
from unicron.control.place.rates import RateMeter
from unicron.core.errors import SpecError
from unicron.core.gpus import lookup_gpu
from unicron.core.livespecs import DEFAULT_LIVE_CLUSTER, LiveTaskSpec, parse_live_tasks
from unicron.core.protocol import LaunchWorker, Registration
from unicron.core.settings import Settings
from unicron.core.specs import parse_tasks
from unicron.core.states import TaskState
from unicron.planning.calibration import MEGATRON_SC21
from unicron.planning.planner import ClusterState, plan
from unicron.planning.throughput import (
    ASSUMED_PEAK_FRACTION,
    AssumedCurve,
    MeasuredCurve,
    basis,
    curves_for,
)

from .fakecluster import Clock, Cluster

SLOTS = 2  # two nodes of two slots: 4 in all
GPU = DEFAULT_LIVE_CLUSTER.gpu_type()
ALL = np.array([1, 2, 3, 4], dtype=np.int64)


def spec(
    name: str, weight: float = 1, extra: str = "", flops: str = "flops_per_sample: 1.0e7"
) -> LiveTaskSpec:
    return parse_live_tasks(
        f"name: {name}\nweight: {weight}\n{extra}run: {{program: [python, t.py], iterations: 100, {flops}}}\n"
    )[0]


def state(
    tasks: list[LiveTaskSpec],
    assignment: Mapping[int, Mapping[str, int]],
    measured: Mapping[str, Mapping[int, float]],
    samples: Mapping[str, Mapping[int, float]] | None = None,
) -> ClusterState:
    """What ``Placer.cluster_state`` hands the planner (placing.py: curves_for with the meter's rates)."""
    hardware = DEFAULT_LIVE_CLUSTER
    curves = curves_for(tasks, GPU, SLOTS, measured, samples)
    return ClusterState(
        SLOTS,
        GPU,
        hardware.node_mtbf_hours,
        hardware.planner,
        (0, 1),
        assignment,
        tuple(tasks),
        curves,
        next_node=2,
    )


def reasons(decided: Any) -> dict[str, str]:
    return {d.task: d.reason for d in decided.decisions}


# ---------------------------------------------------------------- the task file


def test_a_task_file_without_throughput_validates() -> None:
    """The least a user writes: a name, a weight and how to run it."""
    (task,) = parse_live_tasks("name: mine\nweight: 1\nrun: {program: [python, train.py], iterations: 50}\n")
    assert task.throughput is None and task.model is None and task.run.flops_per_sample is None
    assert task.minimum == 1 and all(task.is_usable(n) for n in (1, 2, 3, 7))
    bounded = spec("b", extra="min_workers: 2\nmax_workers: 4\n")
    assert [n for n in range(1, 7) if bounded.is_usable(n)] == [2, 3, 4]


def test_an_offline_plan_still_needs_a_model_or_a_table() -> None:
    """`unicron plan` has nothing to measure: its tasks declare, and the error says where a
    task may leave it out."""
    with pytest.raises(SpecError) as caught:
        parse_tasks("tasks:\n  - name: a\n    weight: 1\n")
    assert "exactly one of 'model' and 'throughput'" in str(caught.value)
    assert "live cluster may give neither" in str(caught.value)


def test_run_iterations_is_the_one_count_of_steps() -> None:
    """run.env may not give a task's length (or another run field's key) a second time."""
    for key, field in (
        ("UNICRON_ITERATIONS", "iterations"),
        ("UNICRON_CHECKPOINT_EVERY", "checkpoint_every"),
    ):
        with pytest.raises(SpecError) as caught:
            parse_live_tasks(
                f"name: a\nweight: 1\nrun: {{program: [python, t.py], iterations: 10, env: {{{key}: '5'}}}}\n"
            )
        problem = caught.value.problems[0]
        assert (
            problem.path == "run.env" and f"run.{field}" in problem.message and f"run.{field}" in problem.fix
        )
    # Other contract keys stay the task's to set (docs/reference.md: UNICRON_TRACE_FILE).
    parse_live_tasks(
        "name: a\nweight: 1\n"
        "run: {program: [python, t.py], iterations: 10, env: {UNICRON_TRACE_FILE: /tmp/t}}\n"
    )


def test_the_assumed_share_of_peak_is_the_lowest_in_megatrons_weak_scaling() -> None:
    a100 = lookup_gpu("A100")
    assert a100 is not None
    lowest = min(row[-1] for row in MEGATRON_SC21) * 1e12 / a100.peak_flops
    assert round(lowest, 2) == ASSUMED_PEAK_FRACTION


# ---------------------------------------------------------------- the planner


def test_alone_it_is_planned_at_the_assumed_share_of_peak_and_says_so() -> None:
    decided = plan(state([spec("a")], {}, {}))
    assert decided.allocation() == {"a": 4}
    assert decided.waf == pytest.approx(4 * ASSUMED_PEAK_FRACTION * GPU.peak_flops)
    why = reasons(decided)["a"]
    assert why.startswith("starts on 4 GPUs") and "not measured yet" in why and "peak" in why, why


def test_its_first_measurement_replans_it_with_the_measured_curve() -> None:
    """Measured at 2 GPUs: exact there, the assumed (linear) curve scaled through it elsewhere,
    the reason no longer an assumption."""
    a = spec("a")
    before = curves_for([a], GPU, SLOTS, {})["a"]
    assert isinstance(before, AssumedCurve) and basis(before).startswith("not measured yet")
    after = curves_for([a], GPU, SLOTS, {"a": {2: 0.2e9}})["a"]
    assert isinstance(after, MeasuredCurve) and basis(after) == "measured"
    assert after.evaluate(ALL).rate == pytest.approx([0.1e9, 0.2e9, 0.3e9, 0.4e9])
    decided = plan(state([a], {0: {"a": 2}}, {"a": {2: 0.2e9}}))
    assert decided.allocation() == {"a": 4}  # it grows onto the idle node
    assert decided.waf == pytest.approx(0.4e9)
    assert "not measured" not in reasons(decided)["a"]


def test_an_unmeasured_task_is_assumed_to_do_what_the_measured_ones_do_per_gpu() -> None:
    """Like for like: a is measured at 0.38 GFLOP/s on 4 (95 MFLOP/s per GPU); b, waiting, is
    assumed at the same per GPU, not at a share of the GPU's peak (430 GFLOP/s per GPU here), so
    a keeps its GPUs; b waits, and says what it was assumed to do."""
    a, b = spec("a"), spec("b")
    running = {0: {"a": 2}, 1: {"a": 2}}
    decided = plan(state([a, b], running, {"a": {4: 0.38e9}}))
    assert decided.allocation() == {"a": 4, "b": 0}
    curve = state([a, b], running, {"a": {4: 0.38e9}}).curves["b"]
    assert isinstance(curve, AssumedCurve) and curve.assumed.per_gpu == pytest.approx(0.095e9)
    why = reasons(decided)["b"]
    assert why.startswith("waits") and "not measured yet" in why and "measured tasks" in why, why


def test_with_nothing_measured_it_is_assumed_to_do_what_the_tables_declare_per_gpu() -> None:
    """The geometric mean of the declared tables' rates per GPU (1.0e9/2 and 3.6e9/4 here)."""
    declared = spec("d", extra="throughput: {2: 1.0e9, 4: 3.6e9}\n")
    curve = curves_for([declared, spec("a")], GPU, SLOTS, {})["a"]
    assert isinstance(curve, AssumedCurve)
    assert curve.assumed.per_gpu == pytest.approx(math.sqrt(0.5e9 * 0.9e9))
    assert "declare" in curve.assumed.source


def test_a_measured_task_without_a_table_calibrates_a_declared_one() -> None:
    """a (no table) runs on 4, measured at 0.38 GFLOP/s; b declares {4: 3.6e9} for the same
    program. a was assumed, before any measurement, at the tables' level (0.9 GFLOP/s per GPU):
    its measurement is 0.105 of that, and b's declaration is put on the same level, so a is not
    stopped for b's optimism (tests/test_measured_vs_declared.py, with a table for both)."""
    a, b = spec("a"), spec("b", extra="throughput: {4: 3.6e9}\n")
    running = {0: {"a": 2}, 1: {"a": 2}}
    built = state([a, b], running, {"a": {4: 0.38e9}})
    assert built.curves["b"].evaluate(np.array([4])).rate == pytest.approx([0.38e9])
    assert plan(built).allocation() == {"a": 4, "b": 0}


def test_the_plan_divides_unmeasured_tasks_by_weight() -> None:
    """Linear curves at one rate per GPU: the heavier task is worth more on every GPU. Equal
    weights tie, and the running task keeps its GPUs (moving costs a transition)."""
    a, heavy = spec("a"), spec("b", weight=3)
    running = {0: {"a": 2}, 1: {"a": 2}}
    assert plan(state([a, heavy], running, {})).allocation() == {"a": 0, "b": 4}
    assert plan(state([a, spec("b")], running, {})).allocation() == {"a": 4, "b": 0}
    capped = spec("b", weight=3, extra="max_workers: 2\n")
    assert plan(state([a, capped], running, {})).allocation() == {"a": 2, "b": 2}


def test_without_flops_per_sample_its_scaling_is_measured_on_the_assumed_level() -> None:
    """Samples/s say how a task scales, not how much work it does: at one measured size the
    curve is the assumed one; at two, it takes their ratio, its level the assumed one's."""
    a = spec("a", flops="")
    assumed = curves_for([a], GPU, SLOTS, {})["a"].evaluate(ALL).rate
    one = curves_for([a], GPU, SLOTS, {}, {"a": {2: 40.0}})["a"]
    assert one.evaluate(ALL).rate == pytest.approx(assumed)
    two = curves_for([a], GPU, SLOTS, {}, {"a": {2: 40.0, 4: 60.0}})["a"]
    rate = two.evaluate(ALL).rate
    assert rate[3] / rate[1] == pytest.approx(1.5)  # 60 / 40
    assert math.sqrt(rate[1] * rate[3]) == pytest.approx(math.sqrt(assumed[1] * assumed[3]))
    assert basis(two).startswith("scaling measured in samples/s")
    why = reasons(plan(state([a], {}, {}, {"a": {2: 40.0, 4: 60.0}})))["a"]
    assert "scaling measured in samples/s" in why and "level assumed" in why, why  # still a guess


def test_the_meter_keeps_samples_per_second_apart_from_flops() -> None:
    """A task without FLOPs per sample is measured in samples/s, kept apart from the FLOP/s
    that the dashboard and the calibration read, and across a coordinator's restart."""
    meter = RateMeter(window_s=5.0, skip=0, min_steps=2)
    for step in range(1, 12):
        for rank in range(4):
            meter.report("a", 1, 4, step, rank, 8, 100.0 + step, flops_per_sample=None)
    assert meter.measured("a") == {} and meter.measured_samples("a") == {4: pytest.approx(32.0)}
    again = RateMeter()
    again.restore(meter.kept())
    assert again.measured_samples("a") == {4: pytest.approx(32.0)}
    again.renamed("a", "a#1")
    assert again.measured_samples("a") == {} and again.measured_samples("a#1") == {4: pytest.approx(32.0)}


# ---------------------------------------------------------------- the coordinator

SPEC = "name: lm\nweight: 1\nrun: {{program: [python, train.py], iterations: 1000{flops}}}\n"


@pytest.fixture
def unmeasured(tmp_path: Path) -> Iterator[Any]:
    """A coordinator stepped by hand (as tests/fakecluster.py's ``make``) with one task that
    declares no throughput, on two nodes of 2 slots, launched and at step 1."""
    made: list[Cluster] = []

    def build(flops: str = ", flops_per_sample: 1.0e7") -> Cluster:
        clock = Clock()
        settings = CoordinatorSettings(
            state_dir=tmp_path / f"state{len(made)}",
            checkpoint_root=tmp_path / "ckpt",
            limits=Settings(measure_window_s=3.0),
        )
        cluster = Cluster(Coordinator(settings, clock), clock, settings)
        made.append(cluster)
        for node in ("n0", "n1"):
            cluster.c.register(Registration(node=node, slots=2))
        cluster.c.submit(*parse_live_tasks(SPEC.format(flops=flops), "test"))
        cluster.c.placer.allocator.wait()
        cluster.step()
        assert len([o for _, o in cluster.orders if isinstance(o, LaunchWorker)]) == 4
        cluster.step()
        cluster.train(1)
        assert cluster.c.store.get_task("lm").state is TaskState.RUNNING
        return cluster

    yield build
    for cluster in made:
        cluster.c.shutdown()


def train_until_measured(cluster: Cluster) -> None:
    """A step every 0.25 s, 4 ranks x 4 samples each: 64 samples/s."""
    for step in range(2, 60):
        cluster.clock.now += 0.25
        cluster.train(step)
        if cluster.events("throughput_measured"):
            return
    raise AssertionError("never measured")


def test_the_coordinator_launches_it_on_the_assumption_then_plans_from_its_measurement(
    unmeasured: Any,
) -> None:
    cluster = unmeasured()
    (launch,) = cluster.events("task_launch")
    assert launch["workers"] == 4 and "not measured yet" in launch["reason"], launch
    placer, rates = cluster.c.placer, cluster.c.rates
    curve = placer.cluster_state(cluster.c.store.snapshot())[0].curves["lm"]
    assert isinstance(curve, AssumedCurve)

    train_until_measured(cluster)
    (measured,) = cluster.events("throughput_measured")
    rate = 64 * 1.0e7  # samples/s x FLOPs per sample
    assert measured["workers"] == 4 and measured["flops"] == pytest.approx(rate)
    assert rates.measured("lm") == {4: pytest.approx(rate)}
    placer.allocator.wait()  # the plan table is rebuilt with the measured curve
    assert placer.allocator.table_version == rates.version
    curve = placer.cluster_state(cluster.c.store.snapshot())[0].curves["lm"]
    assert basis(curve) == "measured"
    assert curve.evaluate(np.array([2, 4])).rate == pytest.approx([rate / 2, rate])


def test_without_flops_per_sample_the_coordinator_measures_samples_per_second(unmeasured: Any) -> None:
    cluster = unmeasured(flops="")
    train_until_measured(cluster)
    (measured,) = cluster.events("throughput_measured")
    assert "flops" not in measured and measured["samples_per_s"] == pytest.approx(64.0)
    assert cluster.c.rates.measured("lm") == {}
    assert cluster.c.rates.measured_samples("lm") == {4: pytest.approx(64.0)}
    curve = cluster.c.placer.cluster_state(cluster.c.store.snapshot())[0].curves["lm"]
    assert basis(curve).startswith("scaling measured in samples/s")

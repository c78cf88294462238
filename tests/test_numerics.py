"""Numerical faults in the step (issue 55): a gradient sum that is wrong (not finite, or a spike
in its norm) is never applied, the rank at fault is found, and whose fault it is decides what
follows (``train/numerics.py``, ``train/spikes.py``).

The verdicts and the spike's limit as values; then, end to end, one task of 4 gloo workers on two
nodes: a NaN in one rank's gradients once (a passing fault: the step computed again, nothing
restarts), then a rank that keeps computing NaN whatever its samples (its device: its node is
isolated, the others go on in place), then a bit flipped in a value of one rank's gradients once
(the exponent's high bit), then a spike in one rank's gradients once.
The task must end with the parameters of a failure-free run and with every step having trained on
exactly its global batch; each fault is an incident naming its rank and node. A sample that gives
NaN anywhere fails the task with the verdict, in a second task on the same cluster; in a third,
which skips bad data (``run.on_bad_data: skip``), the step is skipped and the task goes on to the
state of one process that skips it too. A bit flipped in one of the first task's 4 replicas is
mended in place from the others; in a fourth task, of 2 replicas, one flipped sends the task back
to its checkpoint (nothing tells which replica is right), a spike three steps later is judged by
the window of gradient norms the checkpoint holds, and it ends exact.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from pydantic import ValidationError

from bench.chaos import check as chaos_check
from unicron.control.detect.mends import Mends, names_a_device
from unicron.control.launch.localcluster import LocalCluster
from unicron.core.livespecs import FaultSpec, RunSpec
from unicron.core.protocol import NumericalReport
from unicron.core.states import NodeState
from unicron.core.taxonomy import TAXONOMY, ErrorKind
from unicron.core.tiers import Tier
from unicron.train.checkpoint import load_latest
from unicron.train.data import DataStream
from unicron.train.faults import FaultInjector
from unicron.train.metric import Metric
from unicron.train.numerics import REPEAT_STEPS, Outcome, Verdict, WrongSum, judge, norm, repeated, rotated
from unicron.train.numericstep import may_skip, named_again_lately, outcome_of
from unicron.train.spikes import MIN_JUDGED, SpikeWatch
from unicron.train.sumtest import GRADIENT, SPIKE_WINDOWS, SumTest

from .test_live_cluster import (
    MODEL,
    assert_ends_exact,
    assert_every_incident_closed,
    assert_ledger_exact,
    assert_same_state,
    finish_and_settle,
    read_trace,
    story_of,
    traced_task,
)
from .test_live_drain import cli as node_cli

NONE: frozenset[int] = frozenset()


def ranks(*r: int) -> frozenset[int]:
    return frozenset(r)


def test_a_sum_finite_when_computed_again_was_a_passing_fault() -> None:
    assert judge(ranks(1), None, None, 4) is None  # compute again first
    verdict = judge(ranks(1), NONE, None, 4)
    assert verdict is not None and verdict.verdict is Verdict.TRANSIENT and verdict.ranks == ranks(1)


def test_not_finite_twice_is_cross_checked_on_another_rank_before_any_verdict() -> None:
    assert judge(ranks(2), ranks(2), None, 4) is None
    assert rotated(3, 4) == 2 and rotated(0, 4) == 3  # rank 3 computes rank 2's samples


def test_samples_not_finite_on_another_rank_are_the_datas_fault() -> None:
    verdict = judge(ranks(2), ranks(2), ranks(3), 4)  # rank 3, computing rank 2's samples: NaN
    assert verdict is not None and verdict.verdict is Verdict.DATA and verdict.ranks == ranks(2)


def test_a_rank_wrong_on_samples_another_computes_finitely_is_the_devices_fault() -> None:
    for cross in (ranks(2), NONE):  # wrong on rank 1's samples too, or right this once
        verdict = judge(ranks(2), ranks(2), cross, 4)
        assert verdict is not None and verdict.verdict is Verdict.DEVICE and verdict.ranks == ranks(2)


def test_with_no_other_device_to_ask_the_verdict_says_it_cannot_tell() -> None:
    alone = judge(ranks(0), ranks(0), None, 1)
    assert alone is not None and alone.verdict is Verdict.UNRESOLVED and "one rank" in alone.why
    everyone = judge(ranks(0, 1), ranks(0, 1), None, 2)
    assert everyone is not None and everyone.verdict is Verdict.UNRESOLVED
    # Rank 2 checked rank 1's samples, but rank 2 is a suspect too: that check says nothing.
    neighbours = judge(ranks(1, 2), ranks(1, 2), ranks(1, 2), 4)
    assert neighbours is not None and neighbours.verdict is Verdict.UNRESOLVED


def test_a_rank_named_in_a_passing_fault_lately_gets_no_second_chance() -> None:
    passing = {1: (3, 40), 2: (2, 40)}  # rank -> (generation, step) of its last passing fault
    assert repeated(ranks(1, 2), passing, 3, 40 + REPEAT_STEPS) == ranks(1)  # rank 2's: another process
    assert repeated(ranks(1), passing, 3, 41 + REPEAT_STEPS) == NONE  # long enough ago
    assert repeated(ranks(0), passing, 3, 41) == NONE


def test_the_verdicts_kinds_take_a_device_out_and_end_a_task_on_bad_data() -> None:
    device, data = TAXONOMY[ErrorKind.SILENT_DATA_CORRUPTION], TAXONOMY[ErrorKind.NUMERICAL_DATA]
    assert device.tier is Tier.RECONFIGURE and device.needs_repair
    assert data.tier is Tier.FAIL_TASK and not data.needs_repair


def test_a_nan_faults_count_is_bounded_and_it_is_refused_where_no_test_would_catch_it() -> None:
    assert FaultSpec.model_validate({"action": "nan_grad", "rank": 1, "step": 3, "times": 3}).times == 3
    with pytest.raises(ValidationError, match="times"):
        FaultSpec.model_validate({"action": "nan_grad", "rank": 1, "step": 3, "times": 0})
    faults = [{"action": "nan_sample", "rank": 0, "step": 3, "sample": 5}]
    with pytest.raises(ValidationError, match=r"run\.replica_size 1"):
        RunSpec.model_validate({"program": ["x"], "iterations": 9, "replica_size": 2, "faults": faults})


def test_a_half_precision_sum_that_is_finite_is_not_taken_for_an_overflow() -> None:
    assert norm([torch.full((100_000,), 300.0, dtype=torch.float16)]) == pytest.approx(94868.3, rel=1e-3)
    assert not math.isfinite(norm([torch.tensor([1.0, float("inf")], dtype=torch.bfloat16)]))
    assert not math.isfinite(norm([torch.ones(3), torch.tensor([float("nan")], dtype=torch.float64)]))


def test_a_spike_is_judged_against_the_median_of_the_last_norms_applied() -> None:
    watch = SpikeWatch(window=20, factor=10)
    for _ in range(MIN_JUDGED - 1):
        watch.applied(2.0)
    assert watch.limit() is None  # too few norms yet
    watch.applied(2.0)
    assert watch.limit() == 20.0
    for _ in range(9):
        watch.applied(500.0)  # nine large norms let through: the median stays
    assert watch.limit() == 20.0 and "10 x the median of its recent values" in watch.why(
        600, 20, "gradient norm"
    )
    for value in range(30):
        watch.applied(1.0 + value % 2)  # the window is the last 20: ten 1s and ten 2s
    assert watch.limit() == 15.0 and sorted(watch.norms) == watch.ordered
    off = SpikeWatch(window=20, factor=0)
    for _ in range(20):
        off.applied(1.0)
    assert off.limit() is None


def test_a_watch_resumed_from_a_checkpoints_window_judges_as_the_run_that_saved_it() -> None:
    """A relaunch starts with the window its checkpoint holds (``SPIKE_WINDOWS``): the same limit
    as the run that saved it, from the first step; a longer window saved keeps its newest."""
    saved = SpikeWatch(window=20, factor=10)
    for value in range(30):
        saved.applied(1.0 + value % 3)
    relaunched = SpikeWatch(window=20, factor=10)
    relaunched.resumed(list(saved.norms))
    assert relaunched.limit() == saved.limit() == 20.0 and list(relaunched.norms) == list(saved.norms)
    shorter = SpikeWatch(window=10, factor=10)
    shorter.resumed([5.0] * 10 + [1.0] * 10)  # (the newest 10 kept)
    assert shorter.limit() == 10.0 and sorted(shorter.norms) == shorter.ordered
    fresh = SpikeWatch(window=20, factor=10)
    fresh.resumed([1.0] * (MIN_JUDGED - 1))  # (a checkpoint written before enough steps: not judged)
    assert fresh.limit() is None


def test_bad_data_is_skipped_only_where_the_task_says_so_and_not_twice_lately() -> None:
    def loop(skips: bool, skipped: tuple[int, int] | None) -> Any:
        return SimpleNamespace(skips=skips, skipped=skipped, session=SimpleNamespace(generation=3))

    assert may_skip(loop(True, None), 7) and not may_skip(loop(False, None), 7)
    assert not may_skip(loop(True, (3, 7 - REPEAT_STEPS)), 7)  # data wrong again so soon: the end
    assert may_skip(loop(True, (3, 6 - REPEAT_STEPS)), 7)
    assert may_skip(loop(True, (2, 6)), 7)  # another generation's: its members may not know of it
    with pytest.raises(ValidationError, match="on_bad_data"):
        RunSpec.model_validate({"program": ["x"], "iterations": 9, "on_bad_data": "ignore"})


def test_a_spike_factor_inside_a_healthy_steps_variation_is_refused_with_the_fix() -> None:
    with pytest.raises(
        ValidationError,
        match=r"spike_factor\n.*1\.5 is within a healthy step's variation; fix: use 2 or more",
    ):
        RunSpec.model_validate({"program": ["x"], "iterations": 9, "spike_factor": 1.5})
    with pytest.raises(ValidationError, match="spike_window"):
        RunSpec.model_validate({"program": ["x"], "iterations": 9, "spike_window": 5})
    assert RunSpec.model_validate({"program": ["x"], "iterations": 9, "spike_factor": 0}).spike_factor == 0
    with pytest.raises(ValidationError, match="factor"):
        FaultSpec.model_validate({"action": "spike_grad", "rank": 1, "step": 3, "factor": 1})


def test_a_bit_flipped_in_a_gradient_strikes_the_gradient_sent_first_as_often_as_told() -> None:
    """``flip_grad`` flips one bit of the first value of the gradient sent first (the last
    parameter's), in the first ``times`` computations of its step: here the exponent's high bit
    of a float64, which makes 0.5 into 2 to the 1,023 (about 9e307: its square is infinite)."""
    fault = FaultSpec.model_validate({"action": "flip_grad", "rank": 0, "step": 4, "bit": 62, "times": 2})
    sent: list[Any] = []
    injector = FaultInjector([fault], 0, 1, sent.append, "lm")
    first, last = (torch.nn.Parameter(torch.zeros(2, dtype=torch.float64)) for _ in range(2))
    first.grad = torch.tensor([0.25, 0.25], dtype=torch.float64)
    injector.step_started(4)
    for computation, struck in ((1, True), (2, True), (3, False)):  # (the step computed again, twice)
        last.grad = torch.tensor([0.5, -0.5], dtype=torch.float64)
        injector.poison(4, [0], [first, last], [])
        assert last.grad.tolist() == [2.0**1023 if struck else 0.5, -0.5], computation
        assert first.grad.tolist() == [0.25, 0.25]
    assert len(sent) == 1  # announced once


def test_a_checked_metric_is_judged_with_the_gradients_and_its_own_share_names_the_rank() -> None:
    """``session.metric("loss", checked=True)``: its value (the sum over the ranks, over the step's
    samples) is judged as the gradient norm is (not finite, or over ``factor`` x the median of its
    window, by the mean of the limits the ranks offer), a metric not checked is not; one wrong
    joins no window; a rank's own share over the limit alone is wrong; the windows resume."""
    tokens, loss = Metric("tokens"), Metric("loss", checked=True)
    test = SumTest(20, 10.0, [tokens, loss], {})
    assert test.offer() == [0.0] * 4 and test.offered == 4  # (too few values known: none offered)
    for _ in range(MIN_JUDGED):
        test.agree([0.0] * 4)
        test.judge(1.0, test.values([1e9, 32.0], 16), spikes=True)  # (the tokens: never judged)
    assert test.offer() == [10.0, 1.0, 20.0, 1.0]
    test.agree([20.0, 2.0, 40.0, 2.0])  # (two ranks' offers, summed)
    assert test.limits == {GRADIENT: 10.0, "loss": 20.0}
    with pytest.raises(WrongSum, match="a spike in the step's loss: loss 50") as spike:
        test.judge(1.0, {"loss": 50.0}, spikes=True)
    assert spike.value.spike
    with pytest.raises(WrongSum, match="the step's loss is not finite") as nan:
        test.judge(1.0, {"loss": math.nan}, spikes=False)
    assert not nan.value.spike
    assert {name: len(w) for name, w in test.windows().items()} == {GRADIENT: 10, "loss": 10}
    test.judge(1.0, {"loss": 50.0}, spikes=False)  # (taken: a spike the data gives)
    assert test.windows()["loss"][-1] == 50.0
    for total, wrong in ((16 * 2.0, False), (16 * 30.0, True), (math.nan, True)):
        loss.total = total
        assert test.own_wrong(1.0, 16) is wrong, total
    assert test.own_wrong(math.inf, 16)
    resumed = SumTest(20, 10.0, [tokens, loss], test.windows())
    assert resumed.offer() == test.offer() and resumed.windows() == test.windows()
    assert SumTest(20, 0.0, [loss], {}).offer() == []  # (spikes not judged: no limit offered)


def test_a_fault_in_the_loss_strikes_the_checked_metrics_only_and_needs_one() -> None:
    """``spike_loss`` multiplies this rank's sums of the checked metrics (not the gradients) in the
    first ``times`` computations of its step; a program with no checked metric is told so."""
    spike = FaultSpec.model_validate({"action": "spike_loss", "rank": 0, "step": 4, "factor": 100})
    injector = FaultInjector([spike], 0, 1, lambda _: None, "lm")
    tokens, loss = Metric("tokens"), Metric("loss", checked=True)
    param = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    injector.step_started(4)
    for struck in (True, False):
        tokens.total, loss.total, param.grad = 3.0, 2.0, torch.ones(2, dtype=torch.float64)
        injector.poison(4, [0], [param], [loss])
        assert (loss.total, tokens.total, param.grad.tolist()) == (200.0 if struck else 2.0, 3.0, [1.0, 1.0])
    nan = FaultSpec.model_validate({"action": "nan_loss", "rank": 0, "step": 4})
    unchecked = FaultInjector([nan], 0, 1, lambda _: None, "lm")
    unchecked.step_started(4)
    with pytest.raises(
        RuntimeError, match=r"declares none: declare its loss with session.metric\('loss', checked=True\)"
    ):
        unchecked.poison(4, [0], [param], [])


ITERATIONS = 40
FAULTS = [
    {"action": "nan_grad", "rank": 1, "step": 6, "generation": 0},  # once: a passing fault
    # A bit flipped in one replica's parameters, after the update of a step that checkpoints (found
    # in the whole state's check before the checkpoint), then of one that does not (found in the
    # next step's sum): it takes the 3 others' state each time.
    {"action": "flip_param", "rank": 3, "step": 10, "generation": 0},
    {"action": "flip_param", "rank": 3, "step": 12, "generation": 0},
    {"action": "nan_grad", "rank": 2, "step": 14, "generation": 0, "times": 5},  # a faulty device
    # Once, on one of the two left: the exponent's high bit of a value of its gradient flipped.
    {"action": "flip_grad", "rank": 0, "step": 24, "generation": 0, "bit": 62},
    # Once, on one of the two left: a spike (the generation they went on in has known the 10
    # norms a spike is judged against since about step 16).
    {"action": "spike_grad", "rank": 1, "step": 32, "generation": 0},
]


@pytest.mark.timeout(420)
def test_a_nan_is_never_applied_its_rank_found_and_a_faulty_device_taken_out(tmp_path: Path) -> None:
    trace, bad_trace, skip_trace = tmp_path / "trace.jsonl", tmp_path / "bad.jsonl", tmp_path / "skip.jsonl"
    table = "{2: 1.9e9, 4: 3.5e9}"
    spec = traced_task(trace, table, ITERATIONS, 0.0, f"  faults: {json.dumps(FAULTS)}\n")
    stream = DataStream(chaos_check.GLOBAL_BATCH, chaos_check.MICRO_BATCH, chaos_check.DATASET)
    bad_sample = [{"action": "nan_sample", "rank": 0, "step": 3, "sample": stream.batch(3)[5]}]
    bad = traced_task(bad_trace, "{2: 1.9e9}", 10, 0.0, f"  faults: {json.dumps(bad_sample)}\n", name="bad")
    skipping = f"  on_bad_data: skip\n  faults: {json.dumps(bad_sample)}\n"
    skips = traced_task(skip_trace, "{2: 1.9e9}", 10, 0.0, skipping, name="skips")
    diverged_trace = tmp_path / "diverged.jsonl"
    # A replica flipped after step 17 (found in step 18's sum: relaunched from step 15's
    # checkpoint), then a spike in step 20, which the relaunch judges by the window of gradient
    # norms its checkpoint holds (the steps of the run before it: ``sumtest.py``), then one in the
    # loss of step 30.
    flip = [
        {"action": "flip_param", "rank": 1, "step": 17, "generation": 0},
        {"action": "spike_grad", "rank": 1, "step": 20, "generation": 0},
        # A spike in the other rank's loss alone (the example's loss is a checked metric).
        {"action": "spike_loss", "rank": 0, "step": 30, "generation": 0},
    ]
    faults = f"  faults: {json.dumps(flip)}\n"
    diverging = traced_task(
        diverged_trace, "{2: 1.9e9}", ITERATIONS, 0.0, faults, "diverged", checkpoint_every=15
    )
    with LocalCluster(tmp_path / "cluster", nodes=2, slots=2, settings={"isolate_after": 100}) as cluster:
        cluster.submit(spec)
        events, rows = finish_and_settle(cluster, trace)
        story = story_of(events)
        verdicts = [r for r in rows if r["what"] == "numerical"]
        # The passing fault: every rank computed step 6 again and went on; nothing restarted.
        assert {(r["step"], r["verdict"], tuple(r["ranks"])) for r in verdicts} >= {(6, "transient", (1,))}
        # The faulty device: named in step 14, its node taken out, the others on in place.
        assert (14, "device", (2,)) in {(r["step"], r["verdict"], tuple(r["ranks"])) for r in verdicts}
        # The flipped bit (its value's square infinite): found in the step it struck, computed
        # again, gone.
        assert (24, "transient", (0,)) in {(r["step"], r["verdict"], tuple(r["ranks"])) for r in verdicts}
        # The spike: found in the step it struck, computed again, gone.
        spike = {
            (r["verdict"], tuple(r["ranks"]), r["why"].split(":")[0]) for r in verdicts if r["step"] == 32
        }
        assert spike == {("transient", (1,), "a spike in the gradient sum")}, verdicts
        incidents = [e for e in events if e["kind"] == "incident"]
        rejected = [e for e in cluster.get("/v1/events") if e["kind"] == "report_rejected"]
        assert len(incidents) == 6, f"{story}\nreports rejected (all tasks): {rejected}"
        passing, flipped, flipped_again, incident, bit_flipped, spiked = incidents
        for transient, culprit in ((bit_flipped, 0), (spiked, 1)):
            assert transient["detail"]["kind"] == "numerical_transient", story
            assert transient["detail"]["culprit"] == culprit, story
        struck = {e["detail"]["index"]: e["node"] for e in events if e["kind"] == "fault_injected"}
        # The flipped replica: found before step 10's checkpoint (before step 11 computed), then in
        # step 13's sum (before anything of it was applied: its share computed again), mended from
        # a peer in place each time.
        mended = [(r["step"], r["odd"]) for r in rows if r["what"] == "replica_repaired" and r["rank"] == 3]
        assert mended == [(11, [3]), (13, [3])], mended
        for found, step in ((flipped, 10), (flipped_again, 12)):
            assert found["detail"]["kind"] == "replica_repaired" and found["detail"]["culprit"] == 3
            assert found["node"] == struck[1] and found["detail"]["step"] == step, story
        # The passing fault's incident: its rank and node named, recovered in place at once.
        assert passing["detail"]["kind"] == "numerical_transient" and passing["node"] == struck[0], story
        assert passing["detail"]["culprit"] == 1 and passing["detail"]["step"] == 5, story  # (completed)
        assert passing["detail"]["action"] == "reattempt in place", story
        assert_every_incident_closed(events)
        assert incident["detail"]["kind"] == "silent_data_corruption", story
        assert incident["node"] == struck[3] and incident["detail"]["action"] == "reconfigure", story
        states = {n["name"]: n["state"] for n in cluster.get("/v1/nodes")}
        assert states[struck[3]] == "isolated" and list(states.values()).count("healthy") == 1, story
        assert not [e for e in events if e["kind"] == "relaunch"], story
        assert_ledger_exact(rows, ITERATIONS, frozen=frozenset({2, 3}))
        assert_ends_exact(tmp_path, "lm", ITERATIONS)

        cluster.submit(bad)
        cluster.wait(
            lambda: cluster.task("bad")["state"] == "failed", 240, "the task with a bad sample to fail"
        )
        bad_events = cluster.get("/v1/events", task="bad")
        (failed,) = [e for e in bad_events if e["kind"] == "incident"]
        assert failed["detail"]["kind"] == "numerical_data", story_of(bad_events)
        verdict = [r for r in read_trace(bad_trace) if r["what"] == "numerical"]
        assert {(r["step"], r["verdict"]) for r in verdict} == {(3, "data")}, verdict

        skip_events = run_to_the_end(cluster, skips, "skips")
        (skipped,) = [e for e in skip_events if e["kind"] == "incident"]
        assert skipped["detail"]["kind"] == "numerical_skipped" and skipped["detail"]["step"] == 2
        assert skipped["detail"]["verdict"] == "data" and not [
            e for e in skip_events if e["kind"] == "relaunch"
        ]
        rows = read_trace(skip_trace)
        # Step 3's samples skipped, every other step's trained once; the state of one process
        # that skips the same step (no update; its scheduler stepped: the step counts).
        assert sorted(i for r in rows if r["what"] == "skipped" for i in r["ids"]) == sorted(stream.batch(3))
        for step in range(1, 11):
            got = sorted(i for r in rows if r["what"] == "samples" and r["step"] == step for i in r["ids"])
            assert got == ([] if step == 3 else sorted(stream.batch(step))), step
        contract = {"UNICRON_FAULTS": json.dumps(bad_sample), "UNICRON_ON_BAD_DATA": "skip"}
        alone = chaos_check.reference(tmp_path / "alone", 10, extra=MODEL, env=contract)
        final = load_latest(tmp_path / "cluster" / "checkpoints" / "skips")
        assert final is not None and final["step"] == 10
        assert_same_state(final, alone)

        # Two replicas that differ: nothing tells which is right, so the task goes back to its
        # newest checkpoint (written once they agreed), and ends as a failure-free run does; the
        # spike three steps into the relaunch is found in its step and computed again.
        diverged_events = run_to_the_end(cluster, diverging, "diverged")
        relaunched, spiked, loss_spiked = [e for e in diverged_events if e["kind"] == "incident"]
        assert relaunched["detail"]["kind"] == "replicas_diverged", story_of(diverged_events)
        assert relaunched["detail"]["action"] == "restart from checkpoint"
        assert spiked["detail"]["kind"] == "numerical_transient" and spiked["detail"]["culprit"] == 1
        assert (loss_spiked["detail"]["kind"], loss_spiked["detail"]["culprit"]) == ("numerical_transient", 0)
        rows = read_trace(diverged_trace)
        found = {(r["step"], tuple(r["odd"])) for r in rows if r["what"] == "replicas_diverged"}
        assert found == {(18, (0, 1))}, found  # found in the next step's sum, on both ranks
        assert {r["step"] for r in rows if r["what"] == "resumed"} == {15}
        spikes = {
            (r["step"], r["verdict"], tuple(r["ranks"]), r["why"].split(":")[0])
            for r in rows
            if r["what"] == "numerical"
        }
        assert spikes == {
            (20, "transient", (1,), "a spike in the gradient sum"),
            (30, "transient", (0,), "a spike in the step's loss"),
        }, spikes
        ledger = chaos_check.ledger(rows, ITERATIONS)
        assert ledger.ok and ledger.steps_exact == ITERATIONS, ledger
        assert_ends_exact(tmp_path, "diverged", ITERATIONS)


@pytest.mark.timeout(300)
def test_a_device_whose_replica_keeps_being_mended_is_taken_out_and_the_task_ends_exact(
    tmp_path: Path,
) -> None:
    """One bit of rank 3's parameters flipped after step 4's update and again after step 7's, with
    the ladder's defaults (isolate_after 2): each time the replicas' check finds it in the next
    step's sum and mends rank 3 from its peers in place, and the second time its node is taken
    out as a device fault (its two ranks failed, the other two on in place, nothing relaunched).
    The task ends where a failure-free run does, every step trained on exactly its batch."""
    trace = tmp_path / "trace.jsonl"
    flips = [{"action": "flip_param", "rank": 3, "step": s, "generation": 0} for s in (4, 7)]
    spec = traced_task(trace, "{2: 1.9e9, 4: 3.5e9}", ITERATIONS, 0.0, f"  faults: {json.dumps(flips)}\n")
    with LocalCluster(tmp_path / "cluster", nodes=2, slots=2) as cluster:
        cluster.submit(spec)
        events, rows = finish_and_settle(cluster, trace)
        nodes = {n["name"]: n["state"] for n in cluster.get("/v1/nodes")}
        struck = {e["detail"]["index"]: e["node"] for e in events if e["kind"] == "fault_injected"}
        resumed = node_cli(cluster, "resume", struck[1])  # an operator puts it back (it stays out till then)
        assert resumed.returncode == 0 and f"{struck[1]}: healthy" in resumed.stdout, resumed.stderr
    story = story_of(events)
    mended = [r["step"] for r in rows if r["what"] == "replica_repaired" and r["rank"] == 3]
    assert mended == [5, 8], story
    *repaired, taken = [e for e in events if e["kind"] == "incident"]
    assert [e["detail"]["kind"] for e in repaired] == ["replica_repaired"] * 2, story
    assert (taken["detail"]["kind"], taken["detail"]["action"], taken["node"]) == (
        "silent_data_corruption",
        "reconfigure",
        struck[1],
    ), story
    assert nodes[struck[1]] == "isolated", story
    assert [e["kind"] for e in events].count("task_launch") == 1, story
    assert_every_incident_closed(events)
    assert_ledger_exact(rows, ITERATIONS, frozen=frozenset({2, 3}))
    assert_ends_exact(tmp_path, "lm", ITERATIONS)


def run_to_the_end(cluster: LocalCluster, spec: str, name: str) -> list[dict[str, Any]]:
    """Submit ``spec`` (task ``name``), wait for it to end, check it finished; its events."""
    cluster.submit(spec)
    cluster.wait(lambda: cluster.task(name)["state"] in ("finished", "failed"), 240, f"{name} to end")
    events: list[dict[str, Any]] = cluster.get("/v1/events", task=name)
    assert cluster.task(name)["state"] == "finished", story_of(events)
    return events


def numerical(cluster: Any, rank: int) -> NumericalReport:
    task = cluster.c.store.get_task("lm")
    return NumericalReport(
        task="lm", generation=task.generation, rank=rank, step=2, verdict="transient", ranks=[rank],
        why="computed again, finite", time=cluster.clock.now, spent_s=0.25,
    )  # fmt: skip


def test_a_passing_fault_is_an_incident_recovered_in_place_and_changes_nothing(make: Any) -> None:
    """The coordinator stepped by hand (``tests/fakecluster.py``): the report of a rank whose
    gradients were wrong once is an incident naming it, closed at once, and nothing is
    ordered; the same report sent again is recorded once, and sent by another node's agent is
    refused."""
    cluster = make()
    generation, since = cluster.c.store.get_task("lm").generation, len(cluster.orders)
    node, _ = cluster.running[("lm", generation, 1)]
    other = next(n for n in ("n0", "n1") if n != node)
    cluster.beat(other, numerical(cluster, 1))
    assert cluster.events("report_rejected") and not cluster.events("incident")
    report = numerical(cluster, 1)
    cluster.beat(node, report)
    cluster.beat(node, report)  # sent again (its first heartbeat's answer was lost): recorded once
    (incident,) = cluster.events("incident")
    assert incident["kind"] == "numerical_transient" and incident["culprit"] == 1
    assert incident["action"] == "reattempt in place" and incident["step"] == 1  # the last completed
    (outcome,) = cluster.events("outcome")
    assert outcome["outcome"] == "recovered" and outcome["downtime_s"] == 0.25
    assert cluster.orders[since:] == [] and cluster.c.store.get_task("lm").generation == generation


def test_wrong_numbers_undone_in_the_step_count_against_their_node_within_the_window() -> None:
    mends = Mends(limit=2, window_s=600.0)
    assert mends.note("n0", 0.0) is None and mends.note("n1", 10.0) is None
    assert mends.note("n0", 700.0) is None  # the first is out of the window
    assert mends.note("n0", 800.0) == 2  # taken out: its count starts again
    assert mends.note("n0", 801.0) is None and mends.note("n1", 20.0) == 2
    report = NumericalReport(task="t", generation=1, rank=1, step=2, verdict="transient", ranks=[1], why="")
    assert names_a_device(report) and names_a_device(report.model_copy(update={"outcome": "repaired"}))
    assert not names_a_device(report.model_copy(update={"ranks": [1, 2]}))  # no one rank's alone
    for outcome in ("skipped", "applied"):  # the data's, wherever computed
        assert not names_a_device(report.model_copy(update={"outcome": outcome}))


def test_a_node_whose_ranks_keep_needing_their_numbers_undone_is_taken_out(make: Any) -> None:
    """isolate_after (2 by default) such faults within the ladder's window, each naming one rank
    on the node (a transient, then a replica mended): a device fault. The node is taken out as a
    silent-data-corruption, its ranks failed, the others re-formed in place; nothing relaunched."""
    cluster = make()
    generation = cluster.c.store.get_task("lm").generation
    node, _ = cluster.running[("lm", generation, 1)]
    cluster.beat(node, numerical(cluster, 1))
    assert [i["kind"] for i in cluster.events("incident")] == ["numerical_transient"]
    cluster.clock.now += 30.0
    repaired = {"step": 5, "verdict": "odd_replica", "outcome": "repaired", "time": cluster.clock.now}
    cluster.beat(node, numerical(cluster, 1).model_copy(update=repaired))
    *_, taken = cluster.events("incident")
    assert (taken["kind"], taken["action"], taken["scope"]) == (
        "silent_data_corruption",
        "reconfigure",
        "node",
    )
    assert taken["why"].startswith("its ranks' wrong numbers undone in the step 2 times within 600 s")
    assert cluster.c.store.node(node).state is NodeState.ISOLATED  # type: ignore[union-attr]
    there = {r for (_, g, r), (n, _) in cluster.running.items() if g == generation and n == node}
    task = cluster.c.store.get_task("lm")
    assert task.generation == generation + 1 and task.workers == 4 - len(there)
    assert not cluster.c.store.events(kinds=["relaunch"])
    # Out until an operator resumes it: no tick brings it back, however late.
    cluster.clock.now += 100 * cluster.settings.limits.isolation_s
    cluster.step()
    assert cluster.c.store.node(node).state is NodeState.ISOLATED  # type: ignore[union-attr]
    cluster.restart()  # a new leader keeps it out too
    cluster.step()
    assert cluster.c.store.node(node).state is NodeState.ISOLATED  # type: ignore[union-attr]
    cluster.c.resume_node(node)
    assert cluster.c.store.node(node).state is NodeState.HEALTHY  # type: ignore[union-attr]
    cluster.step()
    assert cluster.c.store.node(node).state is NodeState.HEALTHY  # type: ignore[union-attr]


def test_a_skipped_step_and_an_applied_spike_are_incidents_of_their_own_kinds(make: Any) -> None:
    cluster = make()
    node, _ = cluster.running[("lm", cluster.c.store.get_task("lm").generation, 1)]
    for step, (outcome, verdict) in enumerate((("skipped", "data"), ("applied", "unresolved")), 3):
        named = [1] if verdict == "data" else [1, 2]  # (unresolved: no one rank's share alone)
        update = {"step": step, "verdict": verdict, "outcome": outcome, "ranks": named}
        cluster.beat(node, numerical(cluster, 1).model_copy(update=update))
    skipped, spike = cluster.events("incident")
    assert (skipped["kind"], skipped["verdict"], skipped["culprit"]) == ("numerical_skipped", "data", 1)
    assert (spike["kind"], spike["culprit"]) == ("gradient_spike", None)  # several named: no one culprit
    assert [o["resumed_step"] for o in cluster.events("outcome")] == [4, 4]  # (3 skipped; 4 applied)
    with pytest.raises(ValidationError, match="outcome"):
        NumericalReport.model_validate({**numerical(cluster, 1).model_dump(), "outcome": "ignored"})


def test_what_is_done_about_a_verdict_depends_on_whose_fault_and_whether_a_spike() -> None:
    def loop(skips: bool) -> Any:
        return SimpleNamespace(skips=skips, skipped=None, session=SimpleNamespace(generation=3))

    done = {
        (verdict, skips, spike): outcome_of(loop(skips), 7, verdict, spike)
        for verdict in Verdict
        for skips in (False, True)
        for spike in (False, True)
    }
    assert {done[Verdict.TRANSIENT, k, s] for k in (False, True) for s in (False, True)} == {
        Outcome.RECOMPUTED
    }
    assert {done[Verdict.DEVICE, k, s] for k in (False, True) for s in (False, True)} == {Outcome.LEFT}
    for fault in (Verdict.DATA, Verdict.UNRESOLVED):
        assert done[fault, True, False] == done[fault, True, True] == Outcome.SKIPPED
        assert done[fault, False, True] == Outcome.APPLIED  # a spike the data gives
        assert done[fault, False, False] == Outcome.FAILED  # a NaN is never applied


def test_one_process_applies_a_spike_it_computes_every_time_as_it_would_without_the_test(
    tmp_path: Path,
) -> None:
    """A world of one cannot tell its device's fault from its data's: a spike computed twice is
    applied (as the same run without the test applies it), a NaN would end the run."""
    struck = json.dumps(
        [{"action": "spike_grad", "rank": 0, "step": 15, "generation": 0, "times": 2, "factor": 1e3}]
    )
    trace = tmp_path / "alone.jsonl"
    contract = {"UNICRON_FAULTS": struck, "UNICRON_TRACE_FILE": str(trace)}
    tested = chaos_check.reference(tmp_path / "on", 20, extra=MODEL, env=contract)
    untested = chaos_check.reference(
        tmp_path / "off", 20, extra=MODEL, env={"UNICRON_FAULTS": struck, "UNICRON_CHECK_FINITE": "0"}
    )
    (verdict,) = [r for r in read_trace(trace) if r["what"] == "numerical"]
    assert (verdict["step"], verdict["verdict"], verdict["outcome"]) == (15, "unresolved", "applied")
    assert verdict["why"].startswith("a spike in the gradient sum"), verdict
    assert_same_state(tested, untested)


def test_a_loss_not_finite_or_a_spike_alone_is_found_in_its_step_and_computed_again(tmp_path: Path) -> None:
    """The example's loss is a checked metric: a spike in it (its gradients right) and a NaN in
    it are each found in the step they strike, the rank named, the step computed again, and the
    run ends with the state of a run without them (one process)."""
    struck = [
        {"action": "spike_loss", "rank": 0, "step": 15, "generation": 0, "factor": 1e3},
        {"action": "nan_loss", "rank": 0, "step": 17, "generation": 0},
    ]
    trace = tmp_path / "loss.jsonl"
    contract = {"UNICRON_FAULTS": json.dumps(struck), "UNICRON_TRACE_FILE": str(trace)}
    tested = chaos_check.reference(tmp_path / "on", 20, extra=MODEL, env=contract)
    found = [r for r in read_trace(trace) if r["what"] == "numerical"]
    assert [(r["step"], r["verdict"], r["ranks"], r["outcome"]) for r in found] == [
        (15, "transient", [0], "recomputed"),
        (17, "transient", [0], "recomputed"),
    ], found
    assert found[0]["why"].startswith("a spike in the step's loss: loss ")
    assert found[1]["why"].startswith("the step's loss is not finite")
    assert_same_state(tested, chaos_check.reference(tmp_path / "off", 20, extra=MODEL))
    final = load_latest(tmp_path / "on")
    assert final is not None and sorted(final[SPIKE_WINDOWS]) == [GRADIENT, "loss"]


def test_a_run_resumed_from_a_final_state_judges_spikes_from_its_first_step(tmp_path: Path) -> None:
    """A worker stopped at a step boundary (for a relaunch, a resize, the task's end) saves its
    final state once its step loop has ended: that checkpoint holds the loop's window of gradient
    norms too, so a run resumed from it judges a spike two steps in (one process: applied, as the
    same run without the test would, with its verdict)."""
    out, trace = tmp_path / "checkpoints", tmp_path / "resumed.jsonl"
    chaos_check.reference(out, 12, extra=MODEL)  # (its last checkpoint: the final state of step 12)
    final = load_latest(out)
    assert final is not None and len(final[SPIKE_WINDOWS][GRADIENT]) == 12
    struck = [{"action": "spike_grad", "rank": 0, "step": 14, "generation": 0, "times": 2, "factor": 1e3}]
    contract = {"UNICRON_FAULTS": json.dumps(struck), "UNICRON_TRACE_FILE": str(trace)}
    chaos_check.reference(out, 16, extra=MODEL, env=contract)
    rows = read_trace(trace)
    assert [r["step"] for r in rows if r["what"] == "resumed"] == [12]
    (verdict,) = [r for r in rows if r["what"] == "numerical"]
    assert (verdict["step"], verdict["verdict"], verdict["outcome"]) == (14, "unresolved", "applied")


def named_again(flagged: frozenset[int], passing: dict[int, tuple[int, int]], world: int = 4) -> bool:
    """``numericstep.named_again_lately`` on a step loop of its own (one rank: a collective's max is
    its own value)."""
    peers = SimpleNamespace(max=lambda value: value)
    session = SimpleNamespace(world_size=world, generation=3, groups=SimpleNamespace(peers=peers))
    return named_again_lately(SimpleNamespace(session=session, passing=passing), flagged, 50)  # type: ignore[arg-type]


def test_only_ranks_all_named_lately_and_checkable_skip_their_second_computation() -> None:
    lately = {1: (3, 40), 2: (3, 40)}
    assert named_again(ranks(1), lately)
    assert not named_again(ranks(1, 3), lately)  # rank 3's first fault: computed again first
    assert not named_again(ranks(1, 2), lately)  # neighbours: each would check the other
    assert not named_again(NONE, lately)  # the sum overflowed, no rank's own was wrong
    assert not named_again(ranks(1), {1: (2, 40)})  # another generation's rank 1

"""In-process recovery through real processes: survivors never restart.

One task of 4 gloo workers loses a worker before the gradient all-reduce, another after it, and
then a whole node that goes silent with its connections open (frozen). Each time the survivors
rebuild their process group in place and finish the step with the same global batch; the
planner grows the task back and a newcomer takes its state from a live replica. The task must
end with the parameters of a failure-free run and with every step having trained on exactly its
global batch. (A worker killed with gradient buckets in flight in a world of 4 is
test_live_observability's fault; a lone survivor of one is here.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from unicron.control.launch.localcluster import LocalCluster

from .test_live_cluster import (
    assert_ends_exact,
    assert_every_incident_closed,
    assert_ledger_exact,
    full_speed,
    pace,
    read_trace,
    story_of,
    traced_task,
)

ITERATIONS = 160  # room for the frozen node after two regrows, also on a loaded machine
FAULTS = [
    {"action": "kill", "rank": 1, "step": 15, "generation": 0},
    {"action": "kill_after_reduce", "rank": 2, "step": 40, "generation": 0},
]


@pytest.mark.timeout(600)
def test_survivors_recover_in_place_and_stay_exact(tmp_path: Path) -> None:
    """Two workers killed (before and after the all-reduce), then a node frozen: its peers sit
    inside the all-reduce, which gloo would end only at the process-group timeout (900 s here);
    once the coordinator declares the node lost, the survivors abandon that collective and
    rebuild in place. (Merged from test_survivors_abandon_a_collective_stuck_on_a_frozen_node:
    its node_lost incident recovered in place, nothing relaunched, the ledger with the frozen
    ranks and the exact end are checked here; a hang in place is test_live_hangs'.)"""
    trace = tmp_path / "trace.jsonl"
    table = "{2: 1.9e9, 3: 2.7e9, 4: 3.5e9}"  # (the spec starts the failure-free run's training)
    spec = traced_task(trace, table, ITERATIONS, 0.1, f"  faults: {json.dumps(FAULTS)}\n")
    settings = {"isolate_after": 100, "max_restarts": 100}
    with LocalCluster(tmp_path / "cluster", nodes=2, slots=2, settings=settings) as cluster:
        cluster.submit(spec)

        def task() -> dict:  # type: ignore[type-arg]
            return cluster.task("lm")

        # The steps slow down until the frozen node's survivors have recovered: on a loaded
        # machine a regrow's start, or the node's loss, could outlast the steps left at full pace.
        cluster.wait(lambda: task()["step"] >= 10, 240, "the task to train")
        pace(trace, 0.5)
        cluster.wait(
            lambda: task()["step"] >= 45 and task()["workers"] == 4 and task()["state"] == "running",
            300,
            "two in-place recoveries and growing back",
        )
        grown = task()["step"]
        cluster.wait(lambda: task()["step"] >= grown + 5, 120, "training on 4 after the regrow")
        on_node = frozenset(w["rank"] for w in cluster.get("/v1/workers") if w["node"] == "node-1")
        frozen_at = max(e["id"] for e in cluster.get("/v1/events", task="lm"))
        cluster.freeze_node("node-1")

        def recovered_after_freeze() -> bool:
            after = cluster.get("/v1/events", task="lm")
            return any(e["kind"] == "in_process_recovery" and e["id"] > frozen_at for e in after)

        # Far sooner than the 900 s process-group timeout, or the test's own timeout ends it.
        cluster.wait(recovered_after_freeze, 300, "the survivors of the frozen node to recover")
        full_speed(trace)
        cluster.wait(lambda: task()["state"] == "finished", 300, "the task to finish")
        events = cluster.get("/v1/events", task="lm")
    kinds = [e["kind"] for e in events]
    # Nothing was relaunched from a checkpoint: one launch, every recovery in place.
    story = story_of(events)
    assert kinds.count("task_launch") == 1, story
    incidents = [e["detail"]["kind"] for e in events if e["kind"] == "incident"]
    # Each fault was handled in place (timing may add an incident for a fault's aftermath, and
    # regrows may be merged; neither may cost a relaunch).
    assert {"exited_abnormally", "node_lost"} <= set(incidents), story
    assert kinds.count("in_process_recovery") == len(incidents), story
    # The frozen node: lost, and its survivors recovered in place. Nothing else opened after it:
    # no hang is declared while a node of the task is silent (docs/detection.md).
    after = [e for e in events if e["id"] > frozen_at]
    assert [e["detail"]["kind"] for e in after if e["kind"] == "incident"] == ["node_lost"], story
    assert "in_process_recovery" in [e["kind"] for e in after], story
    assert "task_grown" in kinds
    assert_every_incident_closed(events)
    rows = read_trace(trace)
    # Every membership change ended with the members agreeing on (step, digest). Whether a
    # newcomer had to take state from a live replica depends on timing (a grow that meets a
    # checkpoint step finds the newcomer's loaded state equal already: seen in make test), so it
    # is not asserted here; the transfer is proven where it is forced (the newcomers stranded by
    # a killed source below, the hot-spare test, the sharded replacement, test_nearest_state).
    grown = [e["detail"]["generation"] for e in events if e["kind"] == "task_grown"]
    agreed = {r["generation"] for r in rows if r["what"] == "rejoined"}
    # A grow committed as a member fails (the second kill, in a loaded make test, came as the
    # newcomer joined) is re-formed at once by the recovery: the members pass from the generation
    # before it straight to the recovery's, and agree there.
    recovered = {e["detail"]["generation"] for e in events if e["kind"] == "in_process_recovery"}
    assert all(g in agreed or (g + 1 in recovered and g + 1 in agreed) for g in grown), (grown, agreed)
    assert_ledger_exact(rows, ITERATIONS, frozen=on_node)
    assert_ends_exact(tmp_path, "lm", ITERATIONS)


@pytest.mark.timeout(420)
def test_a_lone_survivor_of_a_worker_killed_with_gradient_buckets_in_flight_recovers_in_place(
    tmp_path: Path,
) -> None:
    """The gradient all-reduce runs in buckets launched during the last backward pass; a rank
    dies right after launching its first one. The survivor's own gradients are untouched (the
    buckets are copies), so it recovers in place and computes only the dead rank's samples,
    although it has no one to settle the step's samples with. (The same fault in a world of 4
    is test_live_observability's.)"""
    trace = tmp_path / "trace.jsonl"
    iterations, workers, dead = 40, 2, 1
    fault = [{"action": "kill_in_backward", "rank": dead, "step": 20, "generation": 0}]
    table = "{1: 1.0e9, 2: 1.9e9}"
    spec = traced_task(trace, table, iterations, 0.1, f"  faults: {json.dumps(fault)}\n")
    with LocalCluster(tmp_path / "cluster", nodes=1, slots=2) as cluster:
        cluster.submit(spec)
        cluster.wait(lambda: cluster.task("lm")["state"] == "finished", 300, "the task to finish")
        events = cluster.get("/v1/events", task="lm")
    kinds = [e["kind"] for e in events]
    assert kinds.count("task_launch") == 1, kinds
    assert [e["detail"]["kind"] for e in events if e["kind"] == "incident"] == ["exited_abnormally"]
    assert [e["detail"]["step"] for e in events if e["kind"] == "fault_injected"] == [20]
    recovered = [e["detail"] for e in events if e["kind"] == "in_process_recovery"]
    assert len(recovered) == 1 and recovered[0]["failed"] == [dead], recovered
    rows = read_trace(trace)
    # The survivor of step 20 recomputed exactly the dead rank's share of it.
    recompute = [r for r in rows if r["what"] == "recompute" and r["step"] == 20]
    assert sum(r["samples"] for r in recompute) == 16 // workers, recompute
    assert_every_incident_closed(events)
    assert_ledger_exact(rows, iterations, frozen=frozenset({dead}), world=workers)
    assert_ends_exact(tmp_path, "lm", iterations)


@pytest.mark.timeout(600)
def test_members_lost_while_the_group_reforms_are_recovered_in_place(tmp_path: Path) -> None:
    """Failures during a recovery: a survivor of a first failure dies as the survivors agree on
    their state, and later a member dies as the regrown group starts sending its state to the
    newcomers. Each time the others, newcomers included, follow the group the coordinator
    re-forms: no process restarts, nothing is relaunched, and the task ends exact."""
    trace = tmp_path / "trace.jsonl"
    iterations = 120
    faults = [
        {"action": "kill", "rank": 1, "step": 15, "generation": 0},
        {"action": "kill_in_agree", "rank": 1, "step": 1, "generation": 0},
        {"action": "kill_in_transfer", "rank": 0, "step": 1, "generation": 0},
    ]
    table = "{1: 1.0e9, 2: 1.9e9, 3: 2.7e9, 4: 3.5e9}"
    # No checkpoint before the end: newcomers start from step 0, so state is always sent to them.
    lines = f"  faults: {json.dumps(faults)}\n"
    spec = traced_task(trace, table, iterations, 0.1, lines, checkpoint_every=1000)
    settings = {"isolate_after": 100, "max_restarts": 100}
    with LocalCluster(tmp_path / "cluster", nodes=2, slots=2, settings=settings) as cluster:
        cluster.submit(spec)
        # The steps slow down until the group has re-formed after the member that died sending
        # its state: on a loaded machine the newcomers' start outlasted the steps left.
        cluster.wait(lambda: cluster.task("lm")["step"] >= 10, 240, "the task to train")
        pace(trace, 1.0)

        def reformed_after_transfer_kill() -> bool:
            seen = cluster.get("/v1/events", task="lm")
            killed = [
                e["id"]
                for e in seen
                if e["kind"] == "fault_injected" and e["detail"]["action"] == "kill_in_transfer"
            ]
            return bool(killed) and any(
                e["kind"] == "in_process_recovery" and e["id"] > killed[0] for e in seen
            )

        cluster.wait(reformed_after_transfer_kill, 360, "the group to re-form after a killed state source")
        full_speed(trace)
        cluster.wait(lambda: cluster.task("lm")["state"] == "finished", 420, "the task to finish")
        events = cluster.get("/v1/events", task="lm")
    story = story_of(events)
    kinds = [e["kind"] for e in events]
    assert kinds.count("task_launch") == 1, story
    assert "checkpoint_restored" not in kinds, story
    injected = sorted(e["detail"]["action"] for e in events if e["kind"] == "fault_injected")
    assert injected == ["kill", "kill_in_agree", "kill_in_transfer"], story
    assert_every_incident_closed(events)
    rows = read_trace(trace)
    # Only the three killed processes ever ended abnormally: every other worker (the first
    # survivors, and newcomers that lost their state's source) went on in its own process.
    killed = {r["pid"] for r in rows if r["what"] == "fault"}
    started = {r["pid"] for r in rows if r["what"] == "started"}
    followed = {r["pid"] for r in rows if r["what"] == "rejoined"}
    assert len(killed) == 3 and killed <= started, killed
    victim = next(r for r in rows if r["what"] == "fault" and r["action"] == "kill_in_transfer")
    # The newcomers whose state source died took it from another live replica.
    stranded = {r["pid"] for r in rows if r["what"] == "started" and r["generation"] == victim["generation"]}
    assert stranded and stranded <= followed, (stranded, followed)
    assert any(r["what"] == "state_from_replica" and r["pid"] in stranded for r in rows)
    assert_ledger_exact(rows, iterations)
    assert_ends_exact(tmp_path, "lm", iterations)

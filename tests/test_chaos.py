"""The chaos soak, short (``make soak`` runs the 15-minute one): every outside fault the soak
knows struck at least once (in a seeded order, a strike every 4 s on average, nodes and the
coordinator away for 0.5-2.5 s) while the first tasks' workers inject every fault of the library
at least once, through the real stack.

Every task finishes with the parameters of a failure-free run and a clean sample ledger, and the
cluster leaves no process, port, shared-memory file or growing descriptor table behind (counted
for its own cluster alone, so that it may run beside other tests).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.chaos.check import surviving_rows
from bench.chaos.schedule import CLUSTER_FAULTS, ITERATIONS, WORKER_FAULTS, Plan
from bench.chaos.soak import measure

from .test_live_cluster import MODEL, shared_reference


def test_the_same_seed_plans_the_same_soak() -> None:
    one, two = Plan(7, 60), Plan(7, 60)
    assert [one.worker_faults() for _ in range(3)] == [two.worker_faults() for _ in range(3)]
    strikes = [one.next_strike(10.0) for _ in range(50)]
    assert strikes == [two.next_strike(10.0) for _ in range(50)]
    assert {s.kind for s in strikes} == set(CLUSTER_FAULTS)
    assert strikes != [Plan(8, 60).next_strike(10.0) for _ in range(50)]


def test_a_covering_plan_strikes_and_deals_every_kind_before_any_repeats() -> None:
    plan = Plan(2, 60, covering=True, pause_s=(0.5, 2.5))
    dealt = [f["action"] for _ in range(3) for f in plan.worker_faults()]
    assert set(dealt[: len(WORKER_FAULTS)]) == set(WORKER_FAULTS)
    strikes = [plan.next_strike(4.0) for _ in range(len(CLUSTER_FAULTS) - 1)]
    assert len({s.kind for s in strikes}) == len(strikes) and not plan.covered
    assert all(0.5 <= s.pause_s <= 2.5 for s in strikes)
    plan.missed(strikes[0].kind)  # it found nothing to strike: again, after the last kind
    last, again = plan.next_strike(4.0), plan.next_strike(4.0)
    assert {last.kind, *(s.kind for s in strikes)} == set(CLUSTER_FAULTS)
    assert again.kind == strikes[0].kind and plan.covered
    same = Plan(2, 60, covering=True, pause_s=(0.5, 2.5))
    assert [f["action"] for _ in range(3) for f in same.worker_faults()] == dealt
    plan.undelivered({"hang", "raise"})  # dealt to a task that ended before they struck: again
    assert {f["action"] for f in plan.worker_faults()} == {"hang", "raise"}


def test_what_a_process_resumed_from_a_checkpoint_trains_again_is_rolled_back() -> None:
    """Generation 1 (process 1) trains steps 1-4. Process 7, launched in generation 2 from the
    checkpoint of step 2, is renamed into generation 3 before its first line and trains steps
    3-4 again: only generation 1's steps 1-2 and its lines are in the final state. A newcomer
    that resumed and then took a replica's state rolls nothing back; one left alone with its
    checkpoint does."""

    def line(generation: int, step: int, pid: int) -> dict[str, object]:
        return {"what": "samples", "generation": generation, "step": step, "ids": [step], "pid": pid}

    def event(what: str, generation: int, pid: int, step: int = 0) -> dict[str, object]:
        return {"what": what, "generation": generation, "pid": pid, "step": step}

    first = [event("started", 1, pid=1)] + [line(1, s, pid=1) for s in (1, 2, 3, 4)]
    relaunch = [event("started", 2, pid=7), event("resumed", 3, pid=7, step=2), line(3, 3, 7), line(3, 4, 7)]
    newcomer = [event("started", 4, pid=9), event("resumed", 4, pid=9, step=0)]
    rows = (
        first
        + relaunch
        + newcomer
        + [event("state_from_replica", 4, pid=9, step=4), line(4, 5, 7), line(4, 5, 9)]
    )
    kept = [(r["generation"], r["step"]) for r in surviving_rows(rows)]
    assert kept == [(1, 1), (1, 2), (3, 3), (3, 4), (4, 5), (4, 5)]
    alone = first + newcomer + [line(5, 1, 9), line(5, 2, 9)]  # generation 1 was declared failed
    assert [(r["generation"], r["step"]) for r in surviving_rows(alone)] == [(5, 1), (5, 2)]
    afresh = [*first, event("started", 6, pid=11), line(6, 1, 11)]  # no checkpoint to resume from
    assert [(r["generation"], r["step"]) for r in surviving_rows(afresh)] == [(6, 1)]


def test_steps_trained_again_by_members_that_then_take_a_newer_replicas_state_are_rolled_back() -> None:
    """Process 1 trains steps 1-4 and is lost; 5 and 6 go on from the checkpoint of step 1 and
    train steps 2-3 again; newcomer 8 loads step 4 from its node's memory, and 5 and 6 take its
    state (seen in a soak): steps 2-4 are generation 1's, not generation 2's."""

    def line(generation: int, step: int, pid: int, rank: int) -> dict[str, object]:
        return {
            "what": "samples",
            "generation": generation,
            "step": step,
            "ids": [step],
            "pid": pid,
            "rank": rank,
        }

    def event(what: str, generation: int, pid: int, step: int, **more: int) -> dict[str, object]:
        return {"what": what, "generation": generation, "pid": pid, "step": step, **more}

    rows = [line(1, s, 1, 0) for s in (1, 2, 3, 4)]
    rows += [event("resumed", 2, 5, 1), event("resumed", 2, 6, 1)]
    rows += [line(2, s, pid, rank) for s in (2, 3) for pid, rank in ((5, 0), (6, 1))]
    rows += [event("resumed", 3, 8, 4), event("state_from_replica", 3, 5, 4, source=2)]
    rows += [event("state_from_replica", 3, 6, 4, source=2), event("ledger", 3, 8, 5, rank=2)]
    rows += [line(3, 5, pid, rank) for pid, rank in ((5, 0), (6, 1), (8, 2))]
    kept = [(r["generation"], r["step"]) for r in surviving_rows(rows)]
    assert kept == [(1, 1), (1, 2), (1, 3), (1, 4), (3, 5), (3, 5), (3, 5)]


@pytest.mark.timeout(900)
def test_a_soak_of_every_fault_loses_nothing(tmp_path: Path) -> None:
    # Strikes go on until every kind struck a target (at most 4 minutes), then every task ends.
    # The tests' model (MODEL), and its failure-free run, which other tests of as many steps use.
    shared = lambda: shared_reference(ITERATIONS, ())  # noqa: E731
    result = measure(tmp_path, minutes=4.0, seed=2, mean_gap_s=4.0, short=True, reference=shared, model=MODEL)
    print(json.dumps({k: result[k] for k in ("elapsed_s", "strikes", "faults_injected")}))  # if it fails
    struck = {s["kind"] for s in result["strikes"] if s["target"] is not None}
    assert struck == set(CLUSTER_FAULTS), result["strikes"]
    injected = {k.removeprefix("worker:") for k in result["faults_injected"] if k.startswith("worker:")}
    assert injected == set(WORKER_FAULTS), result["faults_injected"]
    unfinished = [t["name"] for t in result["tasks"] if not t["finished"]]
    assert unfinished == [] and result["tasks_finished"] >= 3, result["tasks"]
    inexact = [t for t in result["tasks"] if not (t["exact"] and t["ledger_ok"])]
    assert inexact == [], inexact
    assert result["incidents_open"] == [], result["incidents_open"]
    leaks = result["leaks"]
    assert leaks["processes"] == [] and leaks["listening_ports"] == [], leaks
    assert leaks["shared_memory"] == [], leaks
    assert leaks["fd_growth"] <= 16, leaks["fds"]

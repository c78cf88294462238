"""The ladder's tiers through real processes: when the in-process tier fails, the next one runs.

A worker dies; the survivors start to rebuild their group in place (tier one), but one of them
stalls on its way into the new group, so the group never forms and no step is trained. When the
in-process recovery has not regained a step by its deadline, the coordinator escalates: it
stops the stuck generation and restarts the task from its newest intact checkpoint. The
incident records both actions and the escalation; every process of the stuck generation is
replaced; the run ends with the parameters of a failure-free run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from unicron.control.localcluster import LocalCluster

from .test_live_cluster import (
    assert_ends_exact,
    assert_ledger_exact,
    finish_and_settle,
    latest_generation,
    traced_task,
)

ITERATIONS = 40


@pytest.mark.timeout(420)
def test_a_stuck_in_process_recovery_escalates_to_a_restart(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    spec = traced_task(
        trace,
        "{2: 2.0e9, 4: 3.6e9}",
        ITERATIONS,
        0.05,
        "  faults:\n"
        "    - {action: kill, rank: 1, step: 15}\n"
        "    - {action: stall_rejoin, rank: 2, step: 1, seconds: 600}\n",
    )
    settings = {"recovery_deadline_s": 6.0, "hot_spares": 0}
    with LocalCluster(tmp_path / "cluster", nodes=2, slots=2, settings=settings) as cluster:
        cluster.submit(spec)
        events, rows = finish_and_settle(cluster, trace)
    kinds = [e["kind"] for e in events]
    incidents = [e for e in events if e["kind"] == "incident"]
    assert len(incidents) == 1, kinds
    first = incidents[0]["id"]
    # Tier one was tried, failed by its deadline, and the task restarted from its checkpoint.
    assert "in_process_recovery" in kinds
    escalations = [e["detail"] for e in events if e["kind"] == "escalation"]
    assert [(e["incident"], e["from_action"], e["to_action"]) for e in escalations] == [
        (first, "in-process recovery", "restart from checkpoint")
    ]
    assert kinds.count("task_launch") == 2, kinds
    outcomes = [e["detail"] for e in events if e["kind"] == "outcome"]
    assert [(o["incident"], o["outcome"]) for o in outcomes] == [(first, "recovered")]
    assert outcomes[0]["actions"] == ["in-process recovery", "restart from checkpoint"]
    # Which processes ran: the first generation's four, then four new ones after the restart;
    # the stalled survivor was one of those stopped, not kept.
    started = [r for r in rows if r["what"] == "started"]
    relaunched = max(r["generation"] for r in started)
    assert sorted(r["rank"] for r in started if r["generation"] == 1) == [0, 1, 2, 3]
    assert sorted(r["rank"] for r in started if r["generation"] == relaunched) == [0, 1, 2, 3]
    assert len(started) == 8
    resumed = [r for r in rows if r["what"] == "resumed"]
    assert {r["generation"] for r in resumed} == {relaunched} and {r["step"] for r in resumed} == {10}
    assert_ledger_exact(latest_generation(rows), ITERATIONS)
    assert_ends_exact(tmp_path, "lm", ITERATIONS)

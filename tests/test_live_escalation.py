"""The ladder's tiers through real processes: when a tier fails, the next one runs.

A worker dies: its process is gone, and the survivors rebuild their group in place without it
(restart failed processes). One of them stalls on its way into the new group, so the group
never forms and no step is trained. When that has not regained a step by its deadline, the
coordinator escalates one tier, to reconfigure: the stuck worker's node leaves the cluster
(isolated; its processes end) and the others re-form without it. That re-formation stalls too,
and the task restarts from its newest intact checkpoint. The incident records every tier
carried out and each escalation; the run ends with the parameters of a failure-free run. (A
reconfiguration that regains a step, and the grow back off the isolated node, are decided as in
tests/test_coordinator_logic.py::test_a_reconfiguration_that_regains_a_step_recovers_the_task_and_it_grows_back_off_the_node;
a node taken out and the task grown back live: test_live_hosts.py.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from unicron.control.launch.localcluster import LocalCluster

from .test_live_cluster import (
    assert_ends_exact,
    assert_ledger_exact,
    finish_and_settle,
    latest_generation,
    traced_task,
)

ITERATIONS = 40
KILL_AND_STALL = (
    "  faults:\n"
    "    - {action: kill, rank: 1, step: 15}\n"
    "    - {action: stall_rejoin, rank: 2, step: 1, seconds: 600}\n"
)


def run(
    tmp_path: Path, faults: str, iterations: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str]]:
    """The task's events, its trace, and the nodes isolated meanwhile."""
    trace = tmp_path / "trace.jsonl"
    # Every size is usable, so that the task can go on in place with the two workers left.
    spec = traced_task(trace, "{1: 1.0e9, 2: 2.0e9, 3: 2.7e9, 4: 3.6e9}", iterations, 0.05, faults)
    settings = {"recovery_deadline_s": 6.0, "hot_spares": 0}
    with LocalCluster(tmp_path / "cluster", nodes=2, slots=2, settings=settings) as cluster:
        cluster.submit(spec)
        events, rows = finish_and_settle(cluster, trace)
        isolated = [e["node"] for e in cluster.get("/v1/events") if e["kind"] == "node_isolated"]
        return events, rows, isolated


def story(events: list[dict[str, Any]]) -> tuple[list[str], dict[str, Any], list[tuple[str, str]]]:
    """The event kinds, the one incident, and each escalation's (from, to)."""
    kinds = [e["kind"] for e in events]
    incidents = [e for e in events if e["kind"] == "incident"]
    assert len(incidents) == 1, kinds
    escalations = [e["detail"] for e in events if e["kind"] == "escalation"]
    assert {e["incident"] for e in escalations} == {incidents[0]["id"]}
    return kinds, incidents[0], [(e["from_action"], e["to_action"]) for e in escalations]


@pytest.mark.timeout(420)
def test_a_failed_reconfiguration_escalates_to_the_checkpoint(tmp_path: Path) -> None:
    # The survivor that re-forms the group after the reconfiguration stalls on its way too.
    faults = KILL_AND_STALL + "    - {action: stall_rejoin, rank: 0, step: 1, generation: 2, seconds: 600}\n"
    events, rows, isolated = run(tmp_path, faults, ITERATIONS)
    kinds, incident, escalations = story(events)
    assert escalations == [
        ("restart failed processes", "reconfigure"),
        ("reconfigure", "restart from checkpoint"),
    ]
    assert kinds.count("task_launch") == 2, kinds
    # The node where the first stuck worker ran left the cluster (reconfigure).
    stuck = next(r for r in rows if r["what"] == "fault" and r["action"] == "stall_rejoin")
    node = next(r["node"] for r in rows if r["what"] == "started" and r["pid"] == stuck["pid"])
    assert isolated == [node], isolated
    outcomes = [e["detail"] for e in events if e["kind"] == "outcome"]
    assert [(o["incident"], o["outcome"]) for o in outcomes] == [(incident["id"], "recovered")]
    resumed = [r for r in rows if r["what"] == "resumed"]
    relaunched = max(r["generation"] for r in rows if r["what"] == "started")
    assert {r["generation"] for r in resumed} == {relaunched} and {r["step"] for r in resumed} == {10}
    assert_ledger_exact(latest_generation(rows), ITERATIONS)
    assert_ends_exact(tmp_path, "lm", ITERATIONS)

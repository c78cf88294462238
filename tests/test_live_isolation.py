"""Node isolation through real processes: a SEV1 error takes its node out of the plan.

A worker raises an uncorrectable ECC error (classified in-band as SEV1: hardware that needs
repair). Its node is isolated: its workers stop, the survivors on other nodes go on in place,
the planner grows the task back on the healthy nodes only, and the run ends exact.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from unicron.control.launch.localcluster import LocalCluster

from .test_live_cluster import ARGS, TRAIN, assert_ends_exact, assert_ledger_exact, read_trace

ITERATIONS = 60


@pytest.mark.timeout(420)
def test_a_sev1_error_isolates_its_node(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    program = ", ".join(["python", str(TRAIN), *ARGS, "--step-delay", "0.1"])
    fault = {"action": "raise", "rank": 1, "step": 12, "generation": 1, "message": "uncorrectable ECC error"}
    spec = (
        f"name: lm\nweight: 1\nthroughput: {{2: 1.9e9, 4: 3.5e9}}\nrun:\n  program: [{program}]\n"
        f"  iterations: {ITERATIONS}\n  checkpoint_every: 10\n  env: {{UNICRON_TRACE_FILE: {trace}}}\n"
        f"  faults: [{json.dumps(fault)}]\n"
    )
    with LocalCluster(tmp_path / "cluster", nodes=3, slots=2) as cluster:
        cluster.submit(spec)
        cluster.wait(lambda: cluster.task("lm")["state"] == "finished", 300, "the task to finish")
        events = cluster.get("/v1/events")
        nodes = {n["name"]: n["state"] for n in cluster.get("/v1/nodes")}
    incident = next(e for e in events if e["kind"] == "incident")
    assert (incident["detail"]["kind"], incident["detail"]["severity"]) == ("ecc_error", "SEV1")
    isolated = [e["node"] for e in events if e["kind"] == "node_isolated"]
    assert isolated == [incident["node"]] and nodes[incident["node"]] == "isolated"
    # Nothing was placed on the isolated node afterwards.
    after = [e for e in events if e["id"] > incident["id"] and e["kind"] in ("task_launch", "task_grow")]
    assert after and all(incident["node"] not in e["detail"]["placement"] for e in after), after
    assert [e["kind"] for e in events].count("task_launch") == 1  # recovered in place
    rows = read_trace(trace)
    assert_ledger_exact(rows, ITERATIONS)
    assert_ends_exact(tmp_path, "lm", ITERATIONS)

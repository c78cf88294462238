"""Faults of the task itself, through real processes: they must not be blamed on the nodes.

Found by fault probes on a live cluster: a program whose workers all crash, one whose workers
all exit 0 before training, and one that cannot be started were each counted against every
node, so that every node was isolated and the cluster idled, and the failure repeated when the
isolation ended (a missing program even silenced the agents for good). Each such task must stop
with a clear reason, no node may be isolated, and the cluster must go on training other tasks.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from unicron.control.launch.localcluster import LocalCluster

from .test_live_cluster import task_yaml

BAD_TASKS = {
    "crashes": ("[python, -c, 'import sys; sys.exit(3)']", "exited with code 3"),
    "returns": ("[python, -c, 'pass']", "exited before the last step"),
    "missing": ("[/nonexistent/program]", "could not be started"),
}


@pytest.mark.timeout(600)
def test_task_faults_fail_the_task_and_isolate_no_node(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "cluster", nodes=2, slots=2) as cluster:
        for name, (program, _) in BAD_TASKS.items():
            cluster.submit(
                f"name: {name}\nweight: 1\nthroughput: {{4: 1.0e9}}\nmin_workers: 4\n"
                f"run: {{program: {program}, iterations: 10}}\n"
            )
            cluster.wait(lambda n=name: cluster.task(n)["state"] == "failed", 120, f"{name} to fail")
        # The agents still serve and no node was taken out: a real task trains to the end.
        cluster.submit(task_yaml("good", 1, "{2: 2.0e9, 4: 3.6e9}", 20, 0.0))
        cluster.wait(lambda: cluster.task("good")["state"] == "finished", 300, "the good task to finish")
        tasks = {n: cluster.task(n) for n in BAD_TASKS}
        events = cluster.get("/v1/events")
        nodes = cluster.get("/v1/nodes")
    for name, (_, why) in BAD_TASKS.items():
        reason = tasks[name]["reason"] or ""
        assert why in reason and "restarting cannot mend it" in reason, (name, reason)
    assert [e for e in events if e["kind"] == "node_isolated"] == []
    assert all(n["state"] == "healthy" for n in nodes)
    scopes = {e["detail"]["scope"] for e in events if e["kind"] == "incident" and e["task"] in BAD_TASKS}
    assert "node" not in scopes

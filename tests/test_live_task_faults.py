"""Faults of the task itself, through real processes: they must not be blamed on the nodes.

Found by fault probes on a live cluster: a program whose workers all crash, one whose workers
all exit 0 before training, and one that cannot be started were each counted against every
node, so that every node was isolated and the cluster idled, and the failure repeated when the
isolation ended (a missing program even silenced the agents for good). Each such task must stop
with a clear reason, no node may be isolated, and the cluster must go on training other tasks.
A worker that ended before its first step tells what it printed (the incident, `unicron status`);
a failed task's name runs a new task when submitted again, and cancelling it says it has ended.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from unicron.control.launch.localcluster import LocalCluster

from .test_live_cluster import assert_status_shows, task_yaml

SAYS = "cannot open data/train.bin"  # what the crashing program prints before it exits
BAD_TASKS = {
    "crashes": (f"[python, -c, 'import sys; print(\"{SAYS}\"); sys.exit(3)']", "exited with code 3"),
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
            if name == "crashes":  # what it printed, and where, before the others' incidents
                assert_status_shows(cluster, "crashes, incident", "it completed no step", f"| {SAYS}")
        cancel = [sys.executable, "-m", "unicron.cli.main", "cancel", "returns", "--coordinator", cluster.url]
        cancel += ["--token-file", str(cluster.admin_token)]
        said = subprocess.run(cancel, capture_output=True, text=True, timeout=60)
        assert said.returncode == 0 and "returns has already failed" in said.stdout, said
        # The agents still serve and no node was taken out: a real task trains to the end, under
        # the name of a failed one (a new task: the failed one is kept as crashes#1), once the
        # failed one's processes have all exited.
        cluster.wait(lambda: not any("crashes" in n["used"] for n in cluster.get("/v1/nodes")), 60, "exits")
        cluster.submit(task_yaml("crashes", 1, "{2: 2.0e9, 4: 3.6e9}", 20, 0.0))
        cluster.wait(lambda: cluster.task("crashes")["state"] == "finished", 300, "the good task to finish")
        tasks = {t["name"]: t for t in cluster.get("/v1/tasks")}
        events = cluster.get("/v1/events")
        nodes = cluster.get("/v1/nodes")
    assert (tasks["crashes"]["run"], tasks["crashes#1"]["state"]) == (2, "failed")
    for name, (_, why) in BAD_TASKS.items():
        reason = tasks[f"{name}#1" if name == "crashes" else name]["reason"] or ""
        assert why in reason and "restarting cannot mend it" in reason, (name, reason)
    again = tasks["crashes"]["submitted"]  # the failed one's incidents came before
    outputs = [
        e["detail"]
        for e in events
        if e["kind"] == "incident" and e["task"] == "crashes" and e["time"] < again
    ]
    assert outputs and all(d["log_tail"].endswith(SAYS) and d["log"].endswith(".log") for d in outputs)
    assert [e for e in events if e["kind"] == "node_isolated"] == []
    assert all(n["state"] == "healthy" for n in nodes)
    scopes = {e["detail"]["scope"] for e in events if e["kind"] == "incident" and e["task"] in BAD_TASKS}
    assert "node" not in scopes

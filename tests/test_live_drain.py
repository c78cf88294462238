"""Draining a node through the real stack: an admin takes a machine out (``unicron node drain``)
while a task trains on it. The task moves off by planned membership changes (its members there
leave at a step boundary, newcomers join its live replicas on a free node), no process of the
other nodes restarts, nothing is relaunched, and it ends exact; the drained node stays out of
service until resumed, also across a reboot.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from unicron.control.launch.localcluster import LocalCluster

from .test_live_cluster import (
    PACED_HANG_FLOOR_S,
    assert_ends_exact,
    assert_ledger_exact,
    full_speed,
    pace,
    read_trace,
    story_of,
    traced_task,
)


def cli(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "unicron.cli.main", "node", *args, "--coordinator", cluster.url]
    return subprocess.run(
        [*argv, "--token-file", str(cluster.admin_token)], capture_output=True, text=True, timeout=60
    )


@pytest.mark.timeout(420)
def test_a_drained_node_is_emptied_without_losing_a_step(tmp_path: Path) -> None:
    trace, iterations = tmp_path / "trace.jsonl", 160  # (the failure-free run other tests compare with)
    spec = traced_task(trace, "{1: 1.0e9, 2: 1.9e9}", iterations, 0.1)
    settings = {"hang_floor_s": PACED_HANG_FLOOR_S}  # (the steps are paced at 1 s below)
    # Three nodes of one slot: the task on two, the third free to take the drained node's member
    # (two workers and a newcomer to start, not four and two).
    with LocalCluster(tmp_path / "cluster", nodes=3, slots=1, settings=settings) as cluster:
        cluster.submit(spec)
        cluster.wait(
            lambda: cluster.task("lm")["step"] >= 10 and cluster.task("lm")["workers"] == 2, 240, "2 workers"
        )
        # The steps slow down until the task has moved: on a loaded machine the newcomers' start on
        # the free node could outlast the steps left at full pace.
        pace(trace, 1.0)
        before = {w["pid"]: w["node"] for w in cluster.get("/v1/workers") if w["state"] == "running"}
        drained = sorted(set(before.values()))[0]
        done = cli(cluster, "drain", drained, "--reason", "maintenance")
        assert done.returncode == 0 and "draining" in done.stdout, done.stderr
        again = cli(cluster, "drain", drained)
        assert again.returncode == 2 and "already draining" in again.stderr  # an error, not a traceback

        def moved() -> bool:
            live = [w for w in cluster.get("/v1/workers") if w["state"] == "running"]
            return len(live) == 2 and drained not in {w["node"] for w in live}

        cluster.wait(moved, 240, f"the task to move off {drained}")
        full_speed(trace)
        cluster.wait(lambda: cluster.task("lm")["state"] == "finished", 300, "the task to finish")
        nodes = {n["name"]: n["state"] for n in cluster.get("/v1/nodes")}
        assert nodes[drained] == "draining"  # out of service until resumed

        def state() -> str:
            return str(next(n["state"] for n in cluster.get("/v1/nodes") if n["name"] == drained))

        cluster.kill_node(drained)  # rebooted for its maintenance: lost, then back
        cluster.wait(lambda: state() == "lost", 60, f"{drained} to be declared lost")
        cluster.start_agent(drained)
        cluster.wait(lambda: state() != "lost", 60, f"{drained} to register again")
        assert state() == "draining"  # the drain outlasts the reboot
        resumed = cli(cluster, "resume", drained)
        assert resumed.returncode == 0 and "healthy" in resumed.stdout, resumed.stderr
        events = cluster.get("/v1/events", limit=100_000)
    kinds = [e["kind"] for e in events]
    story = story_of(events)
    assert kinds.count("task_launch") == 1 and "incident" not in kinds, "\n".join(map(str, story))  # moved
    assert [e["detail"]["reason"] for e in events if e["kind"] == "node_draining"] == ["maintenance"]
    assert "node_resumed" in kinds
    rows = read_trace(trace)
    # The members on the other nodes trained to the end in their processes: none restarted.
    kept = {pid for pid, node in before.items() if node != drained}
    finishers = {r["pid"] for r in rows if r["what"] == "samples" and r["step"] == iterations}
    assert kept <= finishers, (kept, finishers)
    assert_ledger_exact(rows, iterations)
    assert_ends_exact(tmp_path, "lm", iterations)

"""Where the agent takes its workers' reports: a Unix socket, whose path the kernel limits to
107 bytes. A cluster whose folder lies deep (a long ``--run-dir``, or pytest's temporary folders)
once left its agent unable to bind: it never registered, and the cluster timed out waiting."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from unicron.control.agent.agent import MAX_SOCKET_PATH, socket_path
from unicron.control.launch.localcluster import LocalCluster

ROOT = Path(__file__).resolve().parents[1]


def test_the_socket_is_in_the_run_folder_unless_that_path_is_too_long(tmp_path: Path) -> None:
    short = Path("/tmp/r")
    assert socket_path(short) == short / "agent.sock"
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    moved = socket_path(deep)
    assert len(os.fsencode(moved)) <= MAX_SOCKET_PATH and moved.parent != deep
    assert socket_path(deep) == moved  # an agent started again there finds the same one
    assert socket_path(tmp_path / ("d" * 60) / ("f" * 60)) != moved  # another folder, another socket


@pytest.mark.timeout(300)
def test_a_cluster_in_a_deep_folder_trains_and_hears_its_workers(tmp_path: Path) -> None:
    root = tmp_path / ("d" * 60) / ("e" * 40)
    assert len(os.fsencode(root / "agents" / "node-0" / "agent.sock")) > MAX_SOCKET_PATH
    program = json.dumps(["python", str(ROOT / "examples" / "ddp-port" / "train_unicron.py")])
    spec = (
        "name: deep\nweight: 1\nthroughput: {1: 1.0e9}\nmin_workers: 1\n"
        f"run:\n  program: {program}\n  iterations: 6\n  checkpoint_every: 100\n"
    )
    with LocalCluster(root, nodes=1, slots=1) as cluster:  # its agent registers
        cluster.submit(spec)
        cluster.wait(lambda: cluster.task("deep")["state"] in ("finished", "failed"), 240, "the task to end")
        task = cluster.task("deep")
    # Finished with every step reported through the agent's socket (the coordinator counts them).
    assert (task["state"], task["step"]) == ("finished", 6), task

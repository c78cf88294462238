"""Warm starts through the real stack: a node's workers, first launched and restarted, are forked
by its agent's fork server (``control/agent/warmstart.py``), itself forked by the local cluster's
template (``control/agent/template.py``); with ``--cold-start`` each is a new interpreter.
Either way the task ends with a failure-free run's parameters and an exact ledger.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from unicron.control.launch.localcluster import TEMPLATES, LocalCluster

from .test_live_cluster import (
    assert_ends_exact,
    assert_ledger_exact,
    latest_generation,
    read_trace,
    traced_task,
)

SETTINGS = {"hot_spares": 0}


def parent_of(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))


def command_of(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("warm", [True, False], ids=["warm", "cold"])
def test_workers_come_from_the_nodes_fork_server_through_a_restart_and_end_exact(
    tmp_path: Path, warm: bool
) -> None:
    iterations, trace = 30, tmp_path / "t.jsonl"
    spec = traced_task(trace, "{2: 1.9e9}", iterations, 0.1, "  recovery: restart\n")
    seen: dict[int, tuple[int, str, int]] = {}  # worker pid -> its parent, its command, its parent's

    def note() -> None:
        """Each running worker's parent, read while both are alive."""
        for w in cluster.get("/v1/workers"):
            if w["state"] == "running" and w["pid"] and w["pid"] not in seen:
                try:
                    parent = parent_of(w["pid"])
                    seen[w["pid"]] = (parent, command_of(parent), parent_of(parent))
                except (OSError, StopIteration):  # it has just ended
                    continue

    with LocalCluster(tmp_path / "cluster", nodes=1, slots=2, settings=SETTINGS, warm_start=warm) as cluster:
        cluster.submit(spec)
        cluster.wait(lambda: (note(), cluster.task("lm")["step"] >= 8)[1], 180, "lm to train")
        cluster.kill_worker("lm", 1)  # the task restarts both workers from its checkpoint
        cluster.wait(lambda: (note(), cluster.task("lm")["state"] == "finished")[1], 240, "lm to finish")
        agent = cluster.agents["node-0"].pid
    rows = read_trace(trace)
    started = {r["pid"] for r in rows if r["what"] == "started"}
    assert len(started) == 4  # two launched, both relaunched
    assert seen.keys() == started
    if warm:  # one server, forked for the agent by the cluster's template, forked all four
        ((_, command, grandparent),) = set(seen.values())
        assert "unicron.control.agent.forkserver (from a template)" in command
        assert grandparent == TEMPLATES[0].process.pid
    else:
        assert {parent for parent, _, _ in seen.values()} == {agent}
    # (rank 1 may be killed between its step's all-reduce and its ledger line: that share unwritten)
    assert_ledger_exact(latest_generation(rows), iterations, frozen=frozenset({1}), world=2)
    assert_ends_exact(tmp_path, "lm", iterations)

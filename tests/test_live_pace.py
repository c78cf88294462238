"""The heartbeat's pace and the nodes' failure domains through the real stack: a coordinator and
two agents (no task). The coordinator's budget of heartbeats (``heartbeat_rate_max``, here 2 a
second for 2 nodes: the interval doubles, ``core/cadence.py``) is what the agents beat at, and a
silent node is judged by the grown deadline; each agent's ``--domain`` is on its node's row and in
``unicron status``. (The value tests: ``tests/test_cadence.py``, ``tests/test_silence.py``.)"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from unicron.control.launch.localcluster import LocalCluster
from unicron.core.settings import Settings

DOMAINS = {"node-0": "rack-a", "node-1": "rack-b"}
BEATS = 5  # heartbeats counted to tell the pace


def beats(cluster: LocalCluster, node: str) -> int:
    """Heartbeats ``node``'s agent has had answered (its own metrics)."""
    text = httpx.get(f"http://127.0.0.1:{cluster.agent_metrics[node]}/metrics", timeout=5).text
    found = re.search(r"^unicron_agent_heartbeat_seconds_count (\S+)$", text, re.MULTILINE)
    return int(float(found.group(1))) if found else 0


@pytest.mark.timeout(180)
def test_agents_beat_at_the_coordinators_pace_and_a_node_is_judged_by_it(tmp_path: Path) -> None:
    defaults = Settings()
    settings = {"heartbeat_rate_max": 2.0}  # 2 nodes: 1 s between beats, twice the default
    with LocalCluster(
        tmp_path / "cluster", nodes=2, slots=1, settings=settings, agent_metrics=True, domains=DOMAINS
    ) as cluster:
        cluster.wait(
            lambda: [n["state"] for n in cluster.get("/v1/nodes")] == ["healthy", "healthy"],
            60,
            "both agents to register",
        )
        assert {n["name"]: n["domain"] for n in cluster.get("/v1/nodes")} == DOMAINS
        argv = [sys.executable, "-m", "unicron.cli.main", "status", "--coordinator", cluster.url]
        shown = subprocess.run(
            [*argv, "--token-file", str(cluster.admin_token)], capture_output=True, text=True, timeout=60
        )
        assert shown.returncode == 0 and "domain" in shown.stdout and "rack-b" in shown.stdout, shown

        log = cluster.root / "logs" / "agent-node-0.log"
        said = "heartbeat every 1 s (the coordinator's pace for the cluster's size)"
        cluster.wait(lambda: said in log.read_text(), 30, "node-0's agent to adopt the pace")
        assert "failure domain rack-a" in log.read_text()
        # The beats' pace, from one beat seen to the BEATS-th after it (each seen within a poll of
        # 0.05 s): a lower bound only, as a loaded machine beats later, never sooner.
        start = beats(cluster, "node-0") + 1
        cluster.wait(lambda: beats(cluster, "node-0") >= start, 30, "a heartbeat", poll=0.05)
        began = time.monotonic()
        cluster.wait(lambda: beats(cluster, "node-0") >= start + BEATS, 60, f"{BEATS} heartbeats", poll=0.05)
        spacing = (time.monotonic() - began) / BEATS
        assert spacing > 1.5 * defaults.heartbeat_interval_s, spacing  # 1 s, jittered by a tenth

        cluster.kill_node("node-1")
        cluster.wait(
            lambda: any(e["kind"] == "node_lost" for e in cluster.get("/v1/events")), 60, "node-1 lost"
        )
        lost = next(e for e in cluster.get("/v1/events") if e["kind"] == "node_lost")
    # Judged by the grown deadline (twice the default's 2.5 s), not the configured one.
    assert lost["node"] == "node-1" and lost["detail"]["silent_s"] >= 2 * defaults.heartbeat_deadline_s, lost

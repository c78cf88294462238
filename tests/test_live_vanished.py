"""Workers gone with their exits unreported, through the real stack (``control/detect/vanished.py``).

A node's agent dies with its workers mid-training and is started again before the node is
declared lost: nothing reports the workers' exits, and the survivors' errors name no dead rank.
The agent's list on its heartbeats tells. The same rule ends the rows of a cancelled task's
workers gone so (which held their slots for good) and of a task's past its last step (which
waited for them for ever): on the coordinator stepped by hand, tests/test_vanished.py.
"""

from __future__ import annotations

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

# Long enough that the restarted agent is back before its node is declared lost (the rows are
# then not ended as lost with it, which is another path).
SETTINGS = {"heartbeat_deadline_s": 15.0, "hot_spares": 0, "hang_floor_s": PACED_HANG_FLOOR_S}


@pytest.mark.timeout(300)
def test_workers_that_die_with_their_agent_mid_training_are_left_behind_in_place(tmp_path: Path) -> None:
    """A node's agent dies with its workers mid-training and is back before the node is declared
    lost: no exit is reported, and the survivors' errors name no dead rank (before, the task
    waited for a death never reported, re-formed with the dead ranks and waited for them again).
    The agent's list tells: the survivors go on in place without them, the task grows back onto
    the node, and it ends with a failure-free run's parameters and an exact sample ledger."""
    iterations, trace = 60, tmp_path / "t.jsonl"
    spec = traced_task(trace, "{2: 1.9e9, 4: 3.5e9}", iterations, 0.1)
    with LocalCluster(tmp_path / "cluster", nodes=2, slots=2, settings=SETTINGS) as cluster:
        cluster.submit(spec)
        running = lambda: cluster.task("lm")["state"] == "running"  # noqa: E731
        cluster.wait(lambda: running() and cluster.task("lm")["workers"] == 4, 180, "lm on 4 workers")
        cluster.wait(lambda: cluster.task("lm")["step"] >= 10, 120, "lm to train")
        node = "node-1"
        on_node = frozenset(w["rank"] for w in cluster.get("/v1/workers") if w["node"] == node)
        # The survivors' steps slow down until the task has grown back: on a loaded machine the
        # newcomers' start took longer than the steps left (it finished without them, on CI).
        pace(trace, 1.0)
        cluster.kill_node(node)  # the agent and its workers, at once: no exit is reported
        cluster.start_agent(node)
        grown = lambda: any(e["kind"] == "task_grown" for e in cluster.get("/v1/events", task="lm"))  # noqa: E731
        cluster.wait(grown, 180, "the task to grow back onto the node")
        full_speed(trace)
        cluster.wait(lambda: cluster.task("lm")["state"] == "finished", 240, "the task to finish")
        events = cluster.get("/v1/events", limit=100_000)
    kinds = [e["kind"] for e in events]
    assert "node_lost" not in kinds  # found by the agent's list, not with the node
    gone = sorted(e["detail"]["rank"] for e in events if e["kind"] == "worker_gone")
    assert gone == sorted(on_node)
    assert kinds.count("task_launch") == 1  # nothing relaunched from a checkpoint
    assert "in_process_recovery" in kinds and "task_grown" in kinds, story_of(events)
    rows = read_trace(trace)
    # No survivor was restarted (before, they re-formed with the dead ranks, waited for them and
    # were restarted as stuck): the four launched and two newcomers on the node's slots.
    started = [r["pid"] for r in rows if r["what"] == "started"]
    assert len(started) == len(set(started)) == 6, started
    assert_ledger_exact(rows, iterations, frozen=on_node)
    assert_ends_exact(tmp_path, "lm", iterations)

"""Workers gone with their exits unreported, through the real stack (``control/detect/vanished.py``).

A node's agent dies with its workers and is started again before the node is declared lost:
nothing reports the workers' exits, so their rows stay running. If their task is then cancelled
it has no guard of its own any more, and its rows held the node's slots for good, so the next
task waited for them for ever. If their task is past its last step, hang detection stands aside
and the task waited for them for ever. The agent's list on its heartbeats ends them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from unicron.control.launch.localcluster import LocalCluster

from .test_live_cluster import assert_ends_exact, assert_ledger_exact, read_trace, task_yaml, traced_task

# Long enough that the restarted agent is back before its node is declared lost (the rows are
# then not ended as lost with it, which is another path).
SETTINGS = {"heartbeat_deadline_s": 15.0, "hot_spares": 0}


@pytest.mark.timeout(300)
def test_a_cancelled_tasks_workers_that_died_unreported_free_their_slots(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "cluster", nodes=1, slots=2, settings=SETTINGS) as cluster:
        cluster.submit(task_yaml("a", 1, "{2: 1.9e9}", 10_000, 0.1))
        cluster.wait(lambda: cluster.task("a")["step"] >= 3, 120, "a to train")
        (node,) = cluster.node_names
        cluster.kill_node(node)  # the agent and its workers, at once: no exit is reported
        cluster.start_agent(node)
        cluster.request("DELETE", "/v1/tasks/a").raise_for_status()
        cluster.submit(task_yaml("b", 1, "{2: 1.9e9}", 10_000, 0.1))
        cluster.wait(lambda: cluster.task("b")["step"] >= 2, 120, "b to take the slots a's workers held")
        events = cluster.get("/v1/events", limit=100_000)
    kinds = [e["kind"] for e in events]
    assert "node_lost" not in kinds  # the rows were ended by the agent's list, not with the node
    gone = sorted(e["detail"]["rank"] for e in events if e["kind"] == "worker_gone" and e["task"] == "a")
    assert gone == [0, 1]


@pytest.mark.timeout(300)
def test_a_task_whose_workers_vanish_past_its_last_step_is_relaunched_and_ends_exact(tmp_path: Path) -> None:
    """Rank 0 is held in its last step's save (before it reports the final state); the node's
    agent dies with both workers and comes back. Nothing saved the final state: the task is
    relaunched from its checkpoint and ends with a failure-free run's parameters."""
    iterations = 20
    fault = "{action: slow_save, rank: 0, step: 20, generation: 0, seconds: 120}"
    spec = traced_task(tmp_path / "t.jsonl", "{2: 1.9e9}", iterations, 0.05, f"  faults: [{fault}]\n")
    with LocalCluster(tmp_path / "cluster", nodes=1, slots=2, settings=SETTINGS) as cluster:
        cluster.submit(spec)

        def held() -> bool:
            events = cluster.get("/v1/events", task="lm", limit=100_000)
            return cluster.task("lm")["step"] >= iterations and any(
                e["kind"] == "fault_injected" for e in events
            )

        cluster.wait(held, 180, "rank 0 held in the last step's save")
        (node,) = cluster.node_names
        cluster.kill_node(node)
        cluster.start_agent(node)
        cluster.wait(lambda: cluster.task("lm")["state"] == "finished", 180, "the task to finish")
        events = cluster.get("/v1/events", limit=100_000)
    kinds = [e["kind"] for e in events]
    assert "node_lost" not in kinds
    assert sorted(e["detail"]["rank"] for e in events if e["kind"] == "worker_gone") == [0, 1]
    launches = [e["detail"] for e in events if e["kind"] == "task_launch"]
    assert len(launches) == 2 and launches[1]["resume_from"] < iterations  # from the checkpoint
    assert_ends_exact(tmp_path, "lm", iterations)


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
        cluster.kill_node(node)  # the agent and its workers, at once: no exit is reported
        cluster.start_agent(node)
        cluster.wait(lambda: cluster.task("lm")["state"] == "finished", 240, "the task to finish")
        events = cluster.get("/v1/events", limit=100_000)
    kinds = [e["kind"] for e in events]
    assert "node_lost" not in kinds  # found by the agent's list, not with the node
    gone = sorted(e["detail"]["rank"] for e in events if e["kind"] == "worker_gone")
    assert gone == sorted(on_node)
    assert kinds.count("task_launch") == 1  # nothing relaunched from a checkpoint
    assert "in_process_recovery" in kinds and "task_grown" in kinds
    rows = read_trace(trace)
    # No survivor was restarted (before, they re-formed with the dead ranks, waited for them and
    # were restarted as stuck): the four launched and two newcomers on the node's slots.
    started = [r["pid"] for r in rows if r["what"] == "started"]
    assert len(started) == len(set(started)) == 6, started
    assert_ledger_exact(rows, iterations, frozen=on_node)
    assert_ends_exact(tmp_path, "lm", iterations)

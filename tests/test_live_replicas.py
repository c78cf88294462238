"""Replicas of two ranks through the real stack (issue 14, control plane): a task with
``run.replica_size: 2`` is placed a whole replica per node; when one rank dies its replica
leaves with it (the other rank exits on its own, unkilled), the other replica goes on in place,
and the task grows back by a whole replica on one node. No relaunch; it ends exact."""

from __future__ import annotations

import json
from collections import defaultdict
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


def replicas_per_node(workers: list[dict[str, object]]) -> dict[str, list[int]]:
    ranks: dict[str, list[int]] = defaultdict(list)
    for w in workers:
        ranks[str(w["node"])].append(int(str(w["rank"])))
    return {node: sorted(r) for node, r in ranks.items()}


def whole(placed: dict[str, list[int]]) -> bool:
    """Every node holds whole replicas: ranks 2r and 2r + 1 together."""
    return all(
        len(r) % 2 == 0 and all(r[i] // 2 == r[i + 1] // 2 for i in range(0, len(r), 2))
        for r in placed.values()
    )


@pytest.mark.timeout(480)
def test_a_dead_rank_takes_its_replica_out_and_a_whole_one_comes_back(tmp_path: Path) -> None:
    trace, iterations = tmp_path / "trace.jsonl", 80
    fault = [{"action": "kill_in_backward", "rank": 1, "step": 20, "generation": 0}]
    lines = f"  replica_size: 2\n  faults: {json.dumps(fault)}\n"
    spec = traced_task(trace, "{2: 1.9e9, 4: 3.5e9}", iterations, 0.1, lines)
    settings = {"hang_floor_s": PACED_HANG_FLOOR_S}  # (the steps are paced at 1 s below)
    with LocalCluster(tmp_path / "cluster", nodes=3, slots=2, settings=settings) as cluster:
        cluster.submit(spec)
        cluster.wait(lambda: cluster.task("lm")["step"] >= 5, 240, "the task to train")
        first = cluster.get("/v1/workers")
        assert len(first) == 4 and whole(replicas_per_node(first)), first
        partner = next(w["pid"] for w in first if w["rank"] == 0)

        def regrown() -> bool:
            task = cluster.task("lm")
            return task["workers"] == 4 and task["generation"] > 2 and task["state"] == "running"

        # Near the kill (step 20), the steps slow down until the whole replica is back: on a
        # loaded machine its two processes' start outlasted the 6 s of steps left at full pace.
        cluster.wait(lambda: cluster.task("lm")["step"] >= 15, 240, "the task to near its fault")
        pace(trace, 1.0)
        cluster.wait(regrown, 300, "the task to grow back to two replicas")
        again = cluster.get("/v1/workers")
        full_speed(trace)
        cluster.wait(lambda: cluster.task("lm")["state"] == "finished", 300, "the task to finish")
        events = cluster.get("/v1/events", task="lm", limit=100_000)
    story = story_of(events)
    assert whole(replicas_per_node([w for w in again if w["state"] == "running"])), again
    kinds = [e["kind"] for e in events]
    assert kinds.count("task_launch") == 1, story  # recovered in place, never relaunched
    recovered = [e["detail"] for e in events if e["kind"] == "in_process_recovery"]
    assert recovered[0]["failed"] == [1] and recovered[0]["survivors"] == [2, 3], story
    rows = read_trace(trace)
    # Rank 0, whose replica lost rank 1, left by itself (it found itself in no membership).
    mine = [r for r in rows if r["pid"] == partner]
    assert any(r["what"] == "left" for r in mine), mine[-3:]
    assert all(r["step"] < 20 for r in mine if r["what"] == "samples")
    assert_ledger_exact(rows, iterations)
    assert_ends_exact(tmp_path, "lm", iterations)

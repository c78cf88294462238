"""Sharded replicas through the real stack (issue 14): a task of three replicas of two ranks,
its model sharded by FSDP2 inside each replica (examples/fsdp). One rank dies in its backward:
its replica leaves whole, the two others go on in place with the same global batch; a
replacement replica forms and takes each shard from the matching rank of a live replica. Then a
node is lost with a replica on it. The task ends with the parameters and optimizer state of a
failure-free unsharded run (float64) and an exact sample ledger. (The demo's float32, and one
replica alone, on spawned ranks without a cluster: tests/test_fsdp_ranks.py.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from unicron.control.launch.localcluster import LocalCluster
from unicron.train import dcpfiles
from unicron.train.dcpfiles import path_for

from .test_live_cluster import (
    ARGS,
    ROOT,
    assert_ends_exact,
    assert_ledger_exact,
    delay_file,
    pace,
    prefetch_reference,
    read_trace,
    story_of,
    traced_task,
)
from .test_live_replicas import replicas_per_node, whole

# Given the model in full by ARGS (MODEL), as the unsharded failure-free run it is compared with.
FSDP = ROOT / "examples" / "fsdp" / "train.py"


@pytest.mark.timeout(600)
def test_a_sharded_replica_fails_whole_and_a_replacement_takes_shards_from_a_live_one(tmp_path: Path) -> None:
    trace, iterations = tmp_path / "trace.jsonl", 60
    fault = [{"action": "kill_in_backward", "rank": 1, "step": 12, "generation": 0}]
    paced = ["--step-delay", "0.1", "--step-delay-file", str(delay_file(trace))]
    program = ["python", str(FSDP), *ARGS, *paced]
    lines = f"  replica_size: 2\n  faults: {json.dumps(fault)}\n"
    # No checkpoint before the end: a replacement replica can only take its state from a live one.
    table = "{2: 1.9e9, 4: 3.5e9, 6: 5.0e9}"
    spec = traced_task(trace, table, iterations, 0.1, lines, program=program, checkpoint_every=1000)
    prefetch_reference(iterations)  # compared with at the end
    with LocalCluster(tmp_path / "cluster", nodes=3, slots=2) as cluster:
        cluster.submit(spec)
        cluster.wait(lambda: cluster.task("lm")["step"] >= 3, 240, "the task to train")
        first = cluster.get("/v1/workers")
        assert len(first) == 6 and whole(replicas_per_node(first)), first
        # The survivors go on slowly until the replacement replica has joined: under a loaded
        # make test its two workers once took longer to start than the steps left at 0.1 s lasted
        # (the grow given up as "training ended").
        cluster.wait(lambda: cluster.task("lm")["generation"] >= 2, 120, "the killed replica's recovery")
        pace(trace, 1.0)

        def regrown() -> bool:
            task = cluster.task("lm")
            return task["workers"] == 6 and task["generation"] > 2 and task["state"] == "running"

        cluster.wait(regrown, 300, "the task to grow back to three replicas")
        pace(trace, 0.1)
        step = cluster.task("lm")["step"]
        cluster.wait(lambda: cluster.task("lm")["step"] >= step + 3, 120, "training on six again")
        running = [w for w in cluster.get("/v1/workers") if w["state"] == "running"]
        assert whole(replicas_per_node(running)), running
        lost = next(w["node"] for w in running if w["rank"] == 2)
        on_node = frozenset(int(w["rank"]) for w in running if w["node"] == lost)
        cluster.kill_node(lost)
        cluster.wait(lambda: cluster.task("lm")["state"] == "finished", 300, "the task to finish")
        events = cluster.get("/v1/events", task="lm", limit=100_000)
    story = story_of(events)
    assert [e["kind"] for e in events].count("task_launch") == 1, story  # never relaunched
    recovered = [e["detail"] for e in events if e["kind"] == "in_process_recovery"]
    assert recovered[0]["failed"] == [1] and recovered[0]["survivors"] == [2, 3, 4, 5], story
    rows = read_trace(trace)
    shards = [r for r in rows if r["what"] == "sharded"]
    assert shards and all(r["parameters"] < r["of"] for r in shards)  # each rank holds a part
    # The replacement replica's two ranks each took their shard from a live replica's rank at
    # the same position (peers are one rank per replica, per position).
    taken = [r for r in rows if r["what"] == "state_from_replica"]
    assert {r["rank"] % 2 for r in taken} == {0, 1}, taken
    assert_ledger_exact(rows, iterations, frozen=on_node, world=6, replica_size=2)
    assert_ends_exact(tmp_path, "lm", iterations)


@pytest.mark.timeout(600)
def test_a_checkpoint_saved_by_two_sharded_replicas_resumes_at_one(tmp_path: Path) -> None:
    """The checkpoint is written shard by shard (torch.distributed.checkpoint) and reshards as it
    loads: a cluster of two replicas, writing its periodic checkpoints in the background, stops
    once one is committed; a cluster of one replica resumes from the newest and ends as if never
    interrupted. (Two replicas and one, not three and two: the shards are laid out within a
    replica alike whatever their number, and each replica costs two more workers' start.)"""
    first, second, iterations = tmp_path / "first.jsonl", tmp_path / "second.jsonl", 32
    program = ["python", str(FSDP), *ARGS, "--step-delay", "0.05"]
    paced = [*program, "--step-delay-file", str(delay_file(first))]
    table = "{2: 1.9e9, 4: 3.5e9}"
    prefetch_reference(iterations)  # compared with at the end
    with LocalCluster(tmp_path / "first", nodes=2, slots=2) as cluster:
        # Its periodic checkpoints written in the background (on CPUs they are not by default).
        lines = "  replica_size: 2\n  checkpoint_async: true\n"
        cluster.submit(traced_task(first, table, iterations, 0.05, lines, program=paced))
        # Slower steps before the checkpoint of step 10: the cluster must stop before the last
        # step (at full pace on a loaded machine, the steps left could run out first).
        cluster.wait(lambda: cluster.task("lm")["step"] >= 5, 300, "the task to train")
        pace(first, 1.0)
        cluster.wait(lambda: cluster.task("lm")["checkpoint_step"] >= 10, 300, "a checkpoint")
    # The newest checkpoint the two replicas saved (as the cluster shut down, the replica that
    # stopped last may have gone on alone for a step and saved one at world 2).
    saved = newest_saved_at(tmp_path / "first" / "checkpoints" / "lm", world_size=4)
    assert saved["step"] < iterations and saved["replica_size"] == 2
    folder = tmp_path / "cluster" / "checkpoints" / "lm"
    folder.mkdir(parents=True)
    shutil.copytree(
        path_for(tmp_path / "first" / "checkpoints" / "lm", saved["step"]), path_for(folder, saved["step"])
    )
    with LocalCluster(tmp_path / "cluster", nodes=1, slots=2) as cluster:
        cluster.submit(traced_task(second, table, iterations, 0.05, "  replica_size: 2\n", program=program))
        cluster.wait(lambda: cluster.task("lm")["state"] == "finished", 300, "the rest")
    rows = read_trace(second)
    resumed = [r for r in rows if r["what"] == "resumed"]
    assert len(resumed) == 2 and {r["step"] for r in resumed} == {saved["step"]}, resumed
    before = [r for r in read_trace(first) if r["what"] != "samples" or r["step"] <= saved["step"]]
    assert_ledger_exact(before + rows, iterations)
    assert_ends_exact(tmp_path, "lm", iterations)


def newest_saved_at(folder: Path, world_size: int) -> dict[str, Any]:
    """The newest checkpoint in ``folder`` saved by a world of ``world_size`` (read whole)."""
    for path in sorted(folder.glob("step-*.dcp"), reverse=True):
        state = dcpfiles.read_whole(path)
        if state["world_size"] == world_size:
            return state
    raise AssertionError(f"no checkpoint saved at world {world_size} in {folder}")

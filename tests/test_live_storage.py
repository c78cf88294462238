"""Checkpoint storage that fails, through real processes: a storage fault, not the nodes'.

Found by fault probes: a full or unwritable checkpoint directory was counted against every node
(torch.save on a full disk raises a RuntimeError whose text says nothing about the disk,
classified as an unknown worker error), so every node was isolated and the cluster idled; later
a full store stopped the task although every replica held its state. Here the task's checkpoint
directory is a real tmpfs, filled up (a real ENOSPC) or remounted read-only (EROFS, which binds
root too, unlike file modes) while the task trains: the task trains on from memory with the
same processes, one storage incident opens and closes when the storage takes checkpoints again,
and the task ends exact. Storage that never comes back fails the task with the reason once its
final state cannot be saved, and isolates no node.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from unicron.control.launch.localcluster import LocalCluster
from unicron.core.classify import classify_exception
from unicron.core.taxonomy import ErrorKind
from unicron.train import checkpoint
from unicron.train.persisting import Persisting

from .test_live_cluster import (
    assert_ends_exact,
    assert_every_incident_closed,
    assert_ledger_exact,
    read_trace,
    task_yaml,
    traced_task,
)


def small_tmpfs(where: Path, options: str = "size=64k") -> Iterator[Path]:
    """``where`` as a tmpfs, by default of 64 KiB (too small for one checkpoint), unmounted
    afterwards."""
    where.mkdir(parents=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


# Each way storage refuses (full: ENOSPC; read-only: EROFS) is classified in the unit test below
# and driven live in one of the two live scenarios (they share everything after the
# classification; both modes in both scenarios cost a minute of make test for nothing new).
@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """The checkpoint directory of task "full": too small for a checkpoint."""
    yield from small_tmpfs(tmp_path / "cluster" / "checkpoints" / "full", "size=64k")


@pytest.fixture(params=["size=64k", "ro"], ids=["full", "read-only"])
def small_disk(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    yield from small_tmpfs(tmp_path / "small", request.param)


def test_a_checkpoint_that_does_not_fit_is_a_storage_fault(small_disk: Path) -> None:
    with pytest.raises(checkpoint.CheckpointWriteError) as info:
        checkpoint.save(small_disk, 5, {"weights": torch.zeros(100_000)})
    assert classify_exception(info.value) is ErrorKind.STORAGE_ERROR
    assert list(small_disk.iterdir()) == []  # the torn file was removed


@pytest.mark.timeout(600)
def test_storage_that_never_takes_the_final_state_fails_the_task_and_isolates_no_node(
    tmp_path: Path, full_disk: Path
) -> None:
    settings = {"storage_wait_s": 2.0}  # how long the final state waits for the storage
    with LocalCluster(tmp_path / "cluster", nodes=2, slots=2, settings=settings) as cluster:
        cluster.submit(task_yaml("full", 1, "{4: 3.6e9}", 30, 0.0, "min_workers: 4\n"))
        cluster.wait(lambda: cluster.task("full")["state"] == "failed", 300, "the task to fail")
        cluster.submit(task_yaml("good", 1, "{2: 2.0e9, 4: 3.6e9}", 20, 0.0))
        cluster.wait(lambda: cluster.task("good")["state"] == "finished", 300, "the good task to finish")
        failed = cluster.task("full")
        events = cluster.get("/v1/events")
        nodes = cluster.get("/v1/nodes")
    incidents = [e["detail"] for e in events if e["kind"] == "incident" and e["task"] == "full"]
    assert incidents and {i["kind"] for i in incidents} == {"storage_error"}, incidents
    assert {i["scope"] for i in incidents} == {"storage"}
    # It trained every step from memory first; only the final state found no storage.
    assert incidents[0]["action"] == "continue_from_memory" and failed["step"] == 30, (incidents, failed)
    reason = failed["reason"] or ""
    assert "storage" in reason and "restarting cannot mend it" in reason, reason
    assert [e for e in events if e["kind"] == "node_isolated"] == []
    assert all(n["state"] == "healthy" for n in nodes)


def break_storage(where: Path, how: str) -> Callable[[], None]:
    """Make the tmpfs at ``where`` refuse checkpoints (``how``: fill it up, or remount it
    read-only); returns what mends it."""
    if how == "full":
        filler = where / "filler"
        with filler.open("wb") as out, contextlib.suppress(OSError):
            for _ in range(1024):
                out.write(bytes(1 << 20))
                out.flush()
        return lambda: filler.unlink()
    for _ in range(50):  # EBUSY while a checkpoint is being written: try again
        if subprocess.run(["mount", "-o", "remount,ro", str(where)], capture_output=True).returncode == 0:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"could not remount {where} read-only")
    return lambda: subprocess.run(["mount", "-o", "remount,rw", str(where)], check=True)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("how", ["read-only"])
def test_storage_that_fails_mid_run_costs_no_step_and_no_process(tmp_path: Path, how: str) -> None:
    iterations, trace = 80, tmp_path / "trace.jsonl"
    folder = tmp_path / "cluster" / "checkpoints" / "lm"
    store = small_tmpfs(folder, "size=48m")
    next(store)
    try:
        with LocalCluster(tmp_path / "cluster", nodes=2, slots=2) as cluster:
            cluster.submit(traced_task(trace, "{2: 2.0e9, 4: 3.6e9}", iterations, 0.1))
            cluster.wait(lambda: cluster.task("lm")["step"] >= 12, 300, "a first checkpoint")
            mend = break_storage(folder, how)
            cluster.wait(lambda: storage_incidents(cluster), 120, "the storage incident")
            refused = cluster.task("lm")["checkpoint_step"]
            cluster.wait(lambda: cluster.task("lm")["step"] >= 32, 120, "training on from memory")
            mend()
            cluster.wait(lambda: cluster.task("lm")["state"] == "finished", 300, "the task to finish")
            events = cluster.get("/v1/events")
        assert not list(folder.glob("*.tmp"))  # no torn file left behind
        assert_ends_exact(tmp_path, "lm", iterations)  # the final state, saved once the storage was back
    finally:
        next(store, None)  # unmounts
    incidents = [e for e in events if e["kind"] == "incident"]
    assert [i["detail"]["action"] for i in incidents] == ["continue_from_memory"], incidents
    assert incidents[0]["detail"]["scope"] == "storage" and incidents[0]["node"] is not None
    assert_every_incident_closed(events)
    outcome = next(e["detail"] for e in events if e["kind"] == "outcome")
    assert outcome["unpersisted_s"] > 0 and outcome["resumed_step"] > refused, outcome
    assert sum(e["kind"] == "task_launch" for e in events) == 1  # never relaunched
    assert [e for e in events if e["kind"] == "node_isolated"] == []
    rows = read_trace(trace)
    assert sum(r["what"] == "started" for r in rows) == 4  # the same 4 processes throughout
    assert_ledger_exact(rows, iterations)


def storage_incidents(cluster: LocalCluster) -> list[dict[str, Any]]:
    return [e for e in cluster.get("/v1/events") if e["kind"] == "incident"]


def test_a_refusing_tier_is_reported_once_when_it_fails_and_once_when_it_is_back(tmp_path: Path) -> None:
    said: list[tuple[str, bool]] = []
    persisting = Persisting(lambda tier, ok, error, when: said.append((tier, ok)))
    refusing = [True, True, False, False]

    def write() -> Path:
        if refusing.pop(0):
            raise checkpoint.CheckpointWriteError("full")
        return tmp_path

    assert [persisting.attempt("persistent", write) for _ in range(4)] == [None, None, tmp_path, tmp_path]
    assert said == [("persistent", False), ("persistent", True)]


def test_the_final_state_waits_for_the_storage_then_fails_with_its_error(tmp_path: Path) -> None:
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    persisting = Persisting(lambda *_: None, clock=lambda: now[0], sleep=sleep)
    tries: list[float] = []

    def refused() -> Path:
        tries.append(now[0])
        raise checkpoint.CheckpointWriteError("read-only")

    with pytest.raises(checkpoint.CheckpointWriteError):
        persisting.final(refused, wait_s=5.0)
    assert tries == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 5.0]  # retried each second, then one last try
    tries.clear()
    back = iter([False, True])

    def comes_back() -> Path:
        if next(back):
            return tmp_path
        raise checkpoint.CheckpointWriteError("full")

    assert persisting.final(comes_back, wait_s=5.0) == tmp_path

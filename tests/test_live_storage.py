"""A full checkpoint store, through real processes: a storage fault, not the nodes'.

Found by fault probes: a full or unwritable checkpoint directory was counted against every node
(torch.save on a full disk raises a RuntimeError whose text says nothing about the disk,
classified as an unknown worker error), so every node was isolated and the cluster idled. Here
the task's checkpoint directory is a real tmpfs, either of 64 KiB, so that rank 0's first save
fails with a real ENOSPC, or mounted read-only (EROFS, which binds root too, unlike file
modes): the fault is the storage's, the task stops with the reason once it repeats, no node is
isolated, and another task trains to the end on the same nodes.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from unicron.control.localcluster import LocalCluster
from unicron.core.classify import classify_exception
from unicron.core.taxonomy import ErrorKind
from unicron.train import checkpoint

from .test_live_cluster import task_yaml


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


@pytest.fixture(params=["size=64k", "ro"], ids=["full", "read-only"])
def full_disk(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    """The checkpoint directory of task "full": too small for a checkpoint, or read-only."""
    yield from small_tmpfs(tmp_path / "cluster" / "checkpoints" / "full", request.param)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    yield from small_tmpfs(tmp_path / "small")


def test_a_checkpoint_that_does_not_fit_is_a_storage_fault(small_disk: Path) -> None:
    with pytest.raises(checkpoint.CheckpointWriteError) as info:
        checkpoint.save(small_disk, 5, {"weights": torch.zeros(100_000)})
    assert classify_exception(info.value) is ErrorKind.STORAGE_ERROR
    assert list(small_disk.iterdir()) == []  # the torn file was removed


@pytest.mark.timeout(600)
def test_a_full_or_read_only_checkpoint_store_fails_the_task_and_isolates_no_node(
    tmp_path: Path, full_disk: Path
) -> None:
    with LocalCluster(tmp_path / "cluster", nodes=2, slots=2) as cluster:
        cluster.submit(task_yaml("full", 1, "{4: 3.6e9}", 30, 0.0, "min_workers: 4\n"))
        cluster.wait(lambda: cluster.task("full")["state"] == "failed", 300, "the task to fail")
        cluster.submit(task_yaml("good", 1, "{2: 2.0e9, 4: 3.6e9}", 20, 0.0))
        cluster.wait(lambda: cluster.task("good")["state"] == "finished", 300, "the good task to finish")
        reason = cluster.task("full")["reason"] or ""
        events = cluster.get("/v1/events")
        nodes = cluster.get("/v1/nodes")
    incidents = [e["detail"] for e in events if e["kind"] == "incident" and e["task"] == "full"]
    assert incidents and {i["kind"] for i in incidents} == {"storage_error"}, incidents
    assert {i["scope"] for i in incidents} == {"storage"}
    assert "storage" in reason and "restarting cannot mend it" in reason, reason
    assert [e for e in events if e["kind"] == "node_isolated"] == []
    assert all(n["state"] == "healthy" for n in nodes)

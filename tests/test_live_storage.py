"""Checkpoint storage that fails, through real processes: a storage fault, not the nodes'.

Found by fault probes: a full or unwritable checkpoint directory was counted against every node
(torch.save on a full disk raises a RuntimeError whose text says nothing about the disk,
classified as an unknown worker error), so every node was isolated and the cluster idled; later
a full store stopped the task although every replica held its state. Here the task's checkpoint
directory is a real tmpfs, filled up (a real ENOSPC) or remounted read-only (EROFS, which binds
root too, unlike file modes) while the task trains: the task trains on from memory with the
same processes, one storage incident opens and closes when the storage takes checkpoints again,
and the task ends exact. Storage that never comes back fails the task with the reason once its
final state cannot be saved, and isolates no node; nor do the task's own faults (a program that
crashes, returns before training or cannot be started), tried on the same cluster.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
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
    assert_status_shows,
    read_trace,
    task_yaml,
    traced_task,
)


def small_tmpfs(where: Path, options: str = "size=64k") -> Iterator[Path]:
    """``where`` as a tmpfs, by default of 64 KiB (too small for one checkpoint), unmounted
    afterwards."""
    refused = mount_tmpfs(where, options)
    if refused is not None:
        pytest.skip(f"cannot mount a tmpfs here: {refused}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def mount_tmpfs(where: Path, options: str) -> str | None:
    """Mount a tmpfs at ``where`` (made); None, or why it could not be mounted."""
    where.mkdir(parents=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True
    )
    return None if mounted.returncode == 0 else mounted.stderr.decode().strip() or "mount failed"


# Each way storage refuses (full: ENOSPC; read-only: EROFS) is classified in the unit test below
# and driven live in one of the two live scenarios (they share everything after the
# classification; both modes in both scenarios cost a minute of make test for nothing new).
@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[str | None]:
    """The checkpoint directory of task "full", too small for a checkpoint: None, or why there
    is none (the test's other parts run without it)."""
    where = tmp_path / "cluster" / "checkpoints" / "full"
    refused = mount_tmpfs(where, "size=64k")
    try:
        yield refused
    finally:
        if refused is None:
            subprocess.run(["umount", "-l", str(where)], check=False)


@pytest.fixture(params=["size=64k", "ro"], ids=["full", "read-only"])
def small_disk(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    yield from small_tmpfs(tmp_path / "small", request.param)


def test_a_checkpoint_that_does_not_fit_is_a_storage_fault(small_disk: Path) -> None:
    with pytest.raises(checkpoint.CheckpointWriteError) as info:
        checkpoint.save(small_disk, 5, {"weights": torch.zeros(100_000)})
    assert classify_exception(info.value) is ErrorKind.STORAGE_ERROR
    assert list(small_disk.iterdir()) == []  # the torn file was removed


SAYS = "cannot open data/train.bin"  # what the crashing program prints before it exits
BAD_TASKS = {
    "crashes": (f"[python, -c, 'import sys; print(\"{SAYS}\"); sys.exit(3)']", "exited with code 3"),
    "returns": ("[python, -c, 'pass']", "exited before the last step"),
    "missing": ("[/nonexistent/program]", "could not be started"),
}


@pytest.mark.timeout(600)
def test_storage_and_task_faults_fail_the_task_and_isolate_no_node(
    tmp_path: Path, full_disk: str | None
) -> None:
    """Faults that are no node's, one task after another on one cluster, then a task that trains.

    Storage that never takes the final state: task "full" trains every step from memory, then
    fails with the reason once its final state found no storage.

    The task's own faults (merged from test_live_task_faults): found by fault probes on a live
    cluster, a program whose workers all crash, one whose workers all exit 0 before training, and
    one that cannot be started were each counted against every node, so that every node was
    isolated and the cluster idled, and the failure repeated when the isolation ended (a missing
    program even silenced the agents for good). Each such task must stop with a clear reason. A
    worker that ended before its first step tells what it printed (the incident, `unicron
    status`); cancelling a failed task says it has ended; a failed task's name runs a new task
    when submitted again.

    Union of both tests' checks: no node isolated, every node healthy, and a real task (under
    the crashed one's name) trains to the end on the same nodes. Where no tmpfs can be mounted,
    the storage part is left out and the test is reported skipped after the others' checks."""
    # storage_wait_s: how long the final state waits for the storage. same_fault_limit: each
    # task's fault is met twice (relaunched once), not three times: a relaunch of "full" is four
    # more workers' start, and the second time shows the repeat as well as the third.
    settings = {"storage_wait_s": 2.0, "same_fault_limit": 2}
    # Two nodes of one slot: each task's workers on both nodes, so a fault counted against the
    # nodes would isolate them; two workers, not four, to start at each launch.
    with LocalCluster(tmp_path / "cluster", nodes=2, slots=1, settings=settings) as cluster:
        if full_disk is None:
            cluster.submit(task_yaml("full", 1, "{2: 2.0e9}", 30, 0.0, "min_workers: 2\n"))
            cluster.wait(lambda: cluster.task("full")["state"] == "failed", 300, "the task to fail")
        for name, (program, _) in BAD_TASKS.items():
            cluster.submit(
                f"name: {name}\nweight: 1\nthroughput: {{2: 1.0e9}}\nmin_workers: 2\n"
                f"run: {{program: {program}, iterations: 10}}\n"
            )
            cluster.wait(lambda n=name: cluster.task(n)["state"] == "failed", 120, f"{name} to fail")
            if name == "crashes":  # what it printed, and where, before the others' incidents
                assert_status_shows(cluster, "crashes, incident", "it completed no step", f"| {SAYS}")
        cancel = [sys.executable, "-m", "unicron.cli.main", "cancel", "returns", "--coordinator", cluster.url]
        cancel += ["--token-file", str(cluster.admin_token)]
        said = subprocess.run(cancel, capture_output=True, text=True, timeout=60)
        assert said.returncode == 0 and "returns has already failed" in said.stdout, said
        # The agents still serve and no node was taken out: a real task trains to the end, under
        # the name of a failed one (a new task: the failed one is kept as crashes#1), once the
        # failed one's processes have all exited.
        cluster.wait(lambda: not any("crashes" in n["used"] for n in cluster.get("/v1/nodes")), 60, "exits")
        cluster.submit(task_yaml("crashes", 1, "{1: 1.0e9, 2: 2.0e9}", 20, 0.0))
        cluster.wait(lambda: cluster.task("crashes")["state"] == "finished", 300, "the good task to finish")
        tasks = {t["name"]: t for t in cluster.get("/v1/tasks")}
        events = cluster.get("/v1/events")
        nodes = cluster.get("/v1/nodes")
    # Both: no node was blamed.
    assert [e for e in events if e["kind"] == "node_isolated"] == []
    assert all(n["state"] == "healthy" for n in nodes)
    # The task's own faults (test_task_faults_fail_the_task_and_isolate_no_node).
    assert (tasks["crashes"]["run"], tasks["crashes"]["state"], tasks["crashes#1"]["state"]) == (
        2,
        "finished",
        "failed",
    )
    for name, (_, why) in BAD_TASKS.items():
        reason = tasks[f"{name}#1" if name == "crashes" else name]["reason"] or ""
        assert why in reason and "restarting cannot mend it" in reason, (name, reason)
    again = tasks["crashes"]["submitted"]  # the failed one's incidents came before
    outputs = [
        e["detail"]
        for e in events
        if e["kind"] == "incident" and e["task"] == "crashes" and e["time"] < again
    ]
    assert outputs and all(d["log_tail"].endswith(SAYS) and d["log"].endswith(".log") for d in outputs)
    scopes = {e["detail"]["scope"] for e in events if e["kind"] == "incident" and e["task"] in BAD_TASKS}
    assert "node" not in scopes
    if full_disk is not None:
        pytest.skip(f"the storage part was not run: cannot mount a tmpfs here ({full_disk})")
    # Storage (test_storage_that_never_takes_the_final_state_fails_the_task_and_isolates_no_node).
    failed = tasks["full"]
    incidents = [e["detail"] for e in events if e["kind"] == "incident" and e["task"] == "full"]
    assert incidents and {i["kind"] for i in incidents} == {"storage_error"}, incidents
    assert {i["scope"] for i in incidents} == {"storage"}
    # It trained every step from memory first; only the final state found no storage.
    assert incidents[0]["action"] == "continue_from_memory" and failed["step"] == 30, (incidents, failed)
    reason = failed["reason"] or ""
    assert "storage" in reason and "restarting cannot mend it" in reason, reason


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

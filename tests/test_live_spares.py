"""Hot spares through real processes: an idle slot holds a started worker, and a grow uses it.

One task that can use 3 of 4 slots: the fourth holds a hot spare for it. A worker is killed; the
survivors shrink in place, and the grow back to 3 takes the spare (a new identity, state from a
live replica: the first transfer arrives damaged, is refused by its digest and taken again from
the other replica) instead of starting a process; a new spare then takes the freed slot. The run ends
with every step's global batch exact and the parameters of a failure-free run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from unicron.control.launch.localcluster import LocalCluster
from unicron.core.workerenv import host_checkpoint_dir

from .test_live_cluster import (
    alive,
    assert_ends_exact,
    assert_ledger_exact,
    full_speed,
    pace,
    read_trace,
    story_of,
    traced_task,
)

ITERATIONS = 60
# The trace rows that say where each worker's state came from (shown when an assertion fails).
DIAGNOSTIC = frozenset(
    {
        "started",
        "fault",
        "state_rejected",
        "state_from_replica",
        "spare_waiting",
        "spare_used",
        "rejoined",
        "resumed",
        "left",
    }
)


@pytest.mark.timeout(420)
def test_a_grow_uses_the_hot_spare(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    spec = traced_task(
        trace,
        "{2: 1.9e9, 3: 2.7e9}",
        ITERATIONS,
        0.1,
        # The first state that rank 2 receives from a replica arrives damaged.
        "  faults: [{action: corrupt_transfer, rank: 2, step: 1, generation: 0}]\n",
        # No checkpoint before the end: a spare loads the newest one when it is used, and one
        # taken at the very step the survivors are at would leave it nothing to receive (in
        # about one run in ten, where the grow met a checkpoint step).
        checkpoint_every=10 * ITERATIONS,
    )
    with LocalCluster(tmp_path / "cluster", nodes=2, slots=2) as cluster:
        cluster.submit(spec)

        def kinds() -> list[str]:
            return [e["kind"] for e in cluster.get("/v1/events", task="lm")]

        cluster.wait(
            lambda: "spare_launched" in kinds() and cluster.task("lm")["step"] >= 10, 300, "a hot spare"
        )
        # The steps slow down until the grow has used the spare: on a loaded machine a spare's
        # start took longer than the steps left (the task finished before the kill, on CI).
        pace(trace, 1.0)
        cluster.wait(
            lambda: any(r["what"] == "spare_waiting" for r in read_trace(trace)),
            120,
            "the spare to be loaded and waiting",
        )
        cluster.kill_worker("lm", 1)
        cluster.wait(lambda: "task_grown" in kinds(), 240, "the grow onto the spare")
        full_speed(trace)
        events = finish_leaving_nothing(cluster, trace, tmp_path / "cluster" / "checkpoints" / "lm")
    names, story = [e["kind"] for e in events], story_of(events)
    assert names.count("task_launch") == 1, story
    assert "in_process_recovery" in names, story
    grows = [e["detail"] for e in events if e["kind"] == "task_grow"]
    assert grows and grows[0]["spares_used"] and grows[0]["new_processes"] == {}, story
    assert "task_grown" in names, story
    assert names.count("spare_launched") >= 2, story  # the freed slot got a new spare
    assert names.count("spare_stopped") == names.count("spare_launched") - 1, story  # one was used
    rows = read_trace(trace)
    assert any(r["what"] == "spare_used" for r in rows)
    assert_damaged_transfer_refused(rows)
    # The killed rank may have died between a completed all-reduce and its ledger line.
    assert_ledger_exact(rows, ITERATIONS, frozen=frozenset({1}), world=3)
    assert_ends_exact(tmp_path, "lm", ITERATIONS)


def finish_leaving_nothing(cluster: LocalCluster, trace: Path, persistent: Path) -> list[dict[str, Any]]:
    """Wait for the task to finish and for nothing of it to stay on the nodes (its spare is
    stopped, its in-memory checkpoints are freed); its events."""
    cluster.wait(lambda: cluster.task("lm")["state"] == "finished", 300, "the task to finish")
    # Every process of the task: also a spare still starting, which has written no line yet (the
    # coordinator records a spare's stop as it orders it, so that is on record once it is gone):
    # the only task, so every worker process the nodes' agents started.
    pids = {r["pid"] for r in read_trace(trace) if r["what"] == "started"}
    cluster.wait(lambda: not any(alive(p, trace) for p in pids), 30, "every process of the task to exit")
    agents = {process.pid for process in cluster.agents.values()}
    cluster.wait(lambda: not workers_under(agents), 30, "every worker process on the nodes to exit")
    cluster.wait(
        lambda: not any(host_checkpoint_dir(persistent, n).exists() for n in ("node-0", "node-1")),
        30,
        "the in-memory checkpoints to be freed",
    )
    events: list[dict[str, Any]] = cluster.get("/v1/events", task="lm")
    return events


def assert_damaged_transfer_refused(rows: list[dict[str, Any]]) -> None:
    """The damaged transfer was refused by its digest and the state taken from the other replica."""
    rejected = [r for r in rows if r["what"] == "state_rejected" and r["rank"] == 2]
    taken = [r for r in rows if r["what"] == "state_from_replica" and r["rank"] == 2]
    # (On failure: the rows that tell who received what, as text, which pytest does not cut short.)
    assert len(rejected) == 1 and taken, "\n".join(
        " ".join(f"{k}={v}" for k, v in r.items() if k not in ("time", "task"))
        for r in rows
        if r["what"] in DIAGNOSTIC
    )
    assert taken[0]["generation"] == rejected[0]["generation"]
    assert taken[0]["source"] != rejected[0]["source"]


def workers_under(agents: set[int]) -> list[int]:
    """The running processes the agents ``agents`` started, and theirs, but their fork servers."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(") ", 1)[1].split() if entry.name.isdigit() else []
        except OSError:
            continue
        if fields and fields[0] != "Z":
            parents[int(entry.name)] = int(fields[1])

    def under(pid: int) -> bool:
        while pid > 1 and pid not in agents:
            pid = parents.get(pid, 0)
        return pid in agents

    found = [p for p in parents if p not in agents and under(p)]
    return [p for p in found if b"unicron.control.agent.forkserver" not in command_line(p)]


def command_line(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""

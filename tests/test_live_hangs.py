"""Hangs whose process keeps running, through real processes: the culprit is named from the
ranks' reported positions, every rank's Python stack is recorded with the incident, and only
the culprit is killed.

One task of 4 gloo workers meets a rank looping in Python in its forward pass, then a rank that
stops before entering the gradient all-reduce. Neither process is stopped (SIGSTOP), so only
where each rank is tells the culprit from the peers that wait for it. Another saves a checkpoint
slowly, which is no hang, and then hangs in the step right after a checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from unicron.control.launch.localcluster import LocalCluster

from .test_live_cluster import (
    assert_ends_exact,
    assert_every_incident_closed,
    assert_ledger_exact,
    finish_and_settle,
    story_of,
    traced_task,
)

ITERATIONS = 60
FAULTS = (
    "  faults:\n"
    "    - {action: spin, rank: 1, step: 12, generation: 0, seconds: 600}\n"
    "    - {action: stall_before_reduce, rank: 2, step: 35, generation: 0, seconds: 600}\n"
)
CULPRIT_FRAMES = {"spin": "_spin (faults.py", "stall_before_reduce": "before_reduce (faults.py"}


@pytest.mark.timeout(420)
def test_a_running_hung_rank_is_found_by_its_position_and_only_it_is_killed(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    spec = traced_task(trace, "{2: 1.9e9, 3: 2.7e9, 4: 3.5e9}", ITERATIONS, 0.05, FAULTS)
    settings = {"hang_warmup_steps": 3, "isolate_after": 100}
    with LocalCluster(tmp_path / "cluster", nodes=2, slots=2, settings=settings) as cluster:
        cluster.submit(spec)
        events, rows = finish_and_settle(cluster, trace)
    story = story_of(events)
    kinds = [e["kind"] for e in events]
    faults = [r for r in rows if r["what"] == "fault"]
    assert [f["action"] for f in faults] == ["spin", "stall_before_reduce"], faults
    hangs = [e["detail"] for e in events if e["kind"] == "hang_detected"]
    assert [h["culprits"] for h in hangs] == [[f["rank"]] for f in faults], story
    assert {h["why"] for h in hangs} == {"not in the collective its peers wait in"}
    # Each hang is an incident handled in place: nothing relaunched from a checkpoint.
    incidents = [e for e in events if e["kind"] == "incident"]
    assert [i["detail"]["kind"] for i in incidents] == ["task_hang", "task_hang"], story
    assert kinds.count("task_launch") == 1 and kinds.count("in_process_recovery") == 2, story
    assert_every_incident_closed(events)
    # Every rank's stack is recorded with its incident; the culprit's says where it hung. (The
    # ranks judged are the generation's: 3 or 4, as the grow that follows the first recovery
    # has let its newcomer in or not.)
    for incident, hang, fault in zip(incidents, hangs, faults, strict=True):
        dumps = [
            e["detail"] for e in events if e["kind"] == "stacks" and e["detail"]["incident"] == incident["id"]
        ]
        stacks = {int(rank): text for d in dumps for rank, text in d["stacks"].items()}
        where = {int(rank): frame for d in dumps for rank, frame in d["where"].items()}
        assert {int(rank) for rank in hang["where"]} <= set(stacks), dumps
        assert all("most recent call first" in text for text in stacks.values()), stacks
        assert where[fault["rank"]].startswith(CULPRIT_FRAMES[fault["action"]]), where
    # Only the culprits were killed: every other process that trained trained the last step (a
    # newcomer of a grow given up as training ended trained nothing).
    culprits = {f["pid"] for f in faults}
    trainers = {r["pid"] for r in rows if r["what"] == "samples"}
    finishers = {r["pid"] for r in rows if r["what"] == "samples" and r["step"] == ITERATIONS}
    assert culprits < trainers and finishers == trainers - culprits, (trainers, culprits, finishers)
    assert_ledger_exact(rows, ITERATIONS)
    assert_ends_exact(tmp_path, "lm", ITERATIONS)


@pytest.mark.timeout(420)
def test_a_rank_hung_in_the_first_step_is_found_without_step_times(tmp_path: Path) -> None:
    """A rank stops in the task's very first step: there are no step times to judge a late step
    by, so only the first step's own deadline finds it. The stopped rank is named and killed,
    the others recover in place, and the task ends exact. The deadline is timed from when every
    rank had started its training session, so the workers' start-up (importing torch: over 30 s
    for four workers on CI's two loaded cores) is no part of it: 15 s is the healthy ranks' time
    to join the group and reach the first all-reduce, with room for a loaded machine."""
    trace = tmp_path / "trace.jsonl"
    fault = "  faults:\n    - {action: hang, rank: 1, step: 1, generation: 1}\n"
    spec = traced_task(trace, "{2: 1.9e9, 3: 2.7e9, 4: 3.5e9}", 30, 0.05, fault)
    events, rows, hang = the_one_hang(tmp_path, spec, {"first_step_timeout_s": 15.0}, nodes=2)
    assert hang["culprits"] == [1] and hang["step"] == 1 and hang["generation"] == 1, story_of(events)
    assert_one_hang_recovered_in_place(tmp_path, events, rows, 30)


@pytest.mark.timeout(420)
def test_a_slow_save_is_no_hang_and_a_hang_right_after_a_checkpoint_is_found_at_once(tmp_path: Path) -> None:
    """Rank 0 takes 6 s to save step 10's checkpoint (four times the hang deadline) while its
    peers wait for it in step 11's all-reduce: its position says it saves, so no hang. Rank 1
    then stops at the start of step 21, right after step 20's checkpoint, with the checkpoint
    allowance at 200 s: the hang is found at the usual deadline (the allowance is given only to
    a save that is seen), rank 1 killed, the others recover in place, and the task ends exact."""
    trace = tmp_path / "trace.jsonl"
    faults = (
        "  faults:\n"
        "    - {action: slow_save, rank: 0, step: 10, generation: 1, seconds: 6}\n"
        "    - {action: hang, rank: 1, step: 21, generation: 1}\n"
    )
    spec = traced_task(trace, "{2: 1.9e9, 3: 2.7e9, 4: 3.5e9}", 40, 0.05, faults)
    settings = {"hang_warmup_steps": 3, "checkpoint_allowance_s": 200.0}
    with LocalCluster(tmp_path / "cluster", nodes=2, slots=2, settings=settings) as cluster:
        cluster.submit(spec)
        found = lambda: any(e["kind"] == "hang_detected" for e in cluster.get("/v1/events", task="lm"))  # noqa: E731
        cluster.wait(found, 90, "the hang after step 20's checkpoint found (not after the 200 s allowance)")
        events, rows = finish_and_settle(cluster, trace)
    story = story_of(events)
    faults_done = [(r["action"], r["step"]) for r in rows if r["what"] == "fault"]
    assert faults_done == [("slow_save", 10), ("hang", 21)], faults_done
    hangs = [e["detail"] for e in events if e["kind"] == "hang_detected"]
    assert [(h["step"], h["culprits"]) for h in hangs] == [(21, [1])], story
    assert_one_hang_recovered_in_place(tmp_path, events, rows, 40)


def the_one_hang(
    tmp_path: Path, spec: str, settings: dict[str, Any], nodes: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, Any]]:
    """Run ``spec`` (traced to trace.jsonl) to its end on ``nodes`` nodes of two slots: its events,
    its trace and its one hang detected."""
    with LocalCluster(tmp_path / "cluster", nodes=nodes, slots=2, settings=settings) as cluster:
        cluster.submit(spec)
        events, rows = finish_and_settle(cluster, tmp_path / "trace.jsonl")
    hangs = [e["detail"] for e in events if e["kind"] == "hang_detected"]
    assert len(hangs) == 1, story_of(events)
    return events, rows, hangs[0]


def assert_one_hang_recovered_in_place(
    tmp_path: Path, events: list[dict[str, Any]], rows: list[dict[str, Any]], iterations: int
) -> None:
    """One hang incident, of rank 1, recovered in place (no relaunch); the task ends exact."""
    story = story_of(events)
    assert [e["detail"]["kind"] for e in events if e["kind"] == "incident"] == ["task_hang"], story
    kinds = [e["kind"] for e in events]
    assert kinds.count("task_launch") == 1 and "in_process_recovery" in kinds, story
    assert_every_incident_closed(events)
    assert_ledger_exact(rows, iterations, frozen=frozenset({1}))
    assert_ends_exact(tmp_path, "lm", iterations)

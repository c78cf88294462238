"""Exits that do not come after a task's last step (``control/detect/tail.py``): the rule on hand-built
records, then the coordinator stepped by hand (tests/fakecluster.py), where such a task stayed
running, its slots taken, for ever."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from unicron.brain.records import TaskRecord
from unicron.control.detect.tail import allowed_s, overdue
from unicron.core.protocol import DoneReport, StorageReport
from unicron.core.settings import Settings
from unicron.core.states import TaskState
from unicron.core.taxonomy import ErrorKind

LIMITS = {"hang_cap_s": 20.0, "checkpoint_allowance_s": 5.0, "storage_wait_s": 60.0}


def test_exits_are_overdue_past_the_allowance_after_the_last_step_only(make: Any) -> None:
    cluster = make(**LIMITS)
    task: TaskRecord = cluster.c.store.get_task("lm")
    live = cluster.c.store.workers("lm", task.generation, live=True)
    ended = replace(task, step=100)
    assert overdue(ended, live, 0.0, 30.0, 25.0, 100) is not None
    assert overdue(ended, live, 0.0, 25.0, 25.0, 100) is None  # not yet
    assert overdue(task, live, 0.0, 30.0, 25.0, 100) is None  # still training: hang detection's
    assert overdue(ended, [], 0.0, 30.0, 25.0, 100) is None  # every worker exited
    assert overdue(replace(ended, state=TaskState.RESTARTING), live, 0.0, 30.0, 25.0, 100) is None
    found = overdue(ended, live[2:], 0.0, 30.0, 25.0, 100)
    assert found is not None and found.ranks == (2, 3) and not found.final_saved
    assert overdue(replace(ended, digest="d"), live, 0.0, 30.0, 25.0, 100).final_saved  # type: ignore[union-attr]
    assert overdue(replace(ended, checkpoint_step=100), live, 0.0, 30.0, 25.0, 100).final_saved  # type: ignore[union-attr]
    limits = Settings(**LIMITS)
    base = limits.hang_cap_s + limits.heartbeat_interval_s
    beat = limits.heartbeat_interval_s
    assert allowed_s(limits, beat, False) == base
    assert allowed_s(limits, beat, True) == base + limits.storage_wait_s


def _wait(cluster: Any, seconds: float) -> None:
    for _ in range(int(seconds / 0.5)):
        cluster.step()


def test_workers_that_never_exit_after_the_last_step_unsaved_are_killed_and_the_task_relaunched(
    make: Any,
) -> None:
    """Every rank trained the last step and none exits (rank 0 hung in the final save). Nothing
    was saved: the task is relaunched from its checkpoint, the hung workers killed."""
    cluster = make(**LIMITS)
    generation = cluster.c.store.get_task("lm").generation
    cluster.train(100)
    _wait(cluster, 20.0)
    assert cluster.c.store.get_task("lm").state is TaskState.RUNNING  # within the cap: waited for
    _wait(cluster, 5.0)
    (late,) = cluster.events("exit_overdue")
    assert late["ranks"] == [0, 1, 2, 3] and not late["final_saved"]
    assert not any(g == generation for _, g, _ in cluster.running)  # killed
    (incident,) = cluster.events("incident")
    assert incident["kind"] == ErrorKind.TASK_HANG.value
    _wait(cluster, 5.0)
    task = cluster.c.store.get_task("lm")
    assert task.generation > generation and task.state is not TaskState.FINISHED  # relaunched


def test_workers_that_never_exit_after_the_final_state_was_saved_end_a_finished_task(make: Any) -> None:
    """Rank 0 reported the final state and then, like every rank, hung on its way out."""
    cluster = make(**LIMITS)
    generation = cluster.c.store.get_task("lm").generation
    cluster.train(100)
    n0 = cluster.running[("lm", generation, 0)][0]
    cluster.beat(n0, DoneReport(task="lm", generation=generation, rank=0, step=100, digest="d"))
    _wait(cluster, 25.0)
    assert cluster.c.store.get_task("lm").state is TaskState.FINISHED
    (late,) = cluster.events("exit_overdue")
    assert late["final_saved"] and not cluster.events("incident")
    assert not any(g == generation for _, g, _ in cluster.running)  # stopped


def test_a_final_state_waiting_for_failing_storage_is_given_the_storage_wait(make: Any) -> None:
    cluster = make(**LIMITS)
    generation = cluster.c.store.get_task("lm").generation
    cluster.train(100)
    n0 = cluster.running[("lm", generation, 0)][0]
    refused = StorageReport(
        task="lm", generation=generation, rank=0, step=100, tier="persistent", ok=False, error="full"
    )
    cluster.beat(n0, refused)
    _wait(cluster, 60.0)
    assert cluster.c.store.get_task("lm").state is TaskState.RUNNING and not cluster.events("exit_overdue")
    _wait(cluster, 30.0)
    assert cluster.events("exit_overdue")

"""What a worker's exit means for its task (``control/recover/exits.py``): the pure decision on
hand-built records, then the coordinator stepped by hand through a generation that leaves after
the last step without saving the final state."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from unicron.brain.records import TaskRecord
from unicron.control.recover.exits import ExitMeans, exit_means
from unicron.core.protocol import DoneReport, ExitReport, StopWorkers
from unicron.core.states import TaskState

TASK = TaskRecord(
    "lm", "{}", TaskState.RUNNING, 2, 4, 100, 90, 0, 0, 0, None, 0.0, 0, 0.0, None, 0.0, 0.0, None, None, 1, 0
)
CLEAN = ExitReport(task="lm", generation=2, rank=0, node="n0", code=0, signal=None)


def means(
    task: TaskRecord = TASK, report: ExitReport = CLEAN, running: bool = False, open_: bool = False
) -> ExitMeans:
    return exit_means(task, report, 100, running, open_).means


def test_a_clean_exit_finishes_the_task_only_once_the_final_state_is_known_saved() -> None:
    assert means(replace(TASK, digest="d")) is ExitMeans.FINISHED
    assert means(replace(TASK, digest="d"), running=True) is ExitMeans.FINISHED  # latecomers are stopped
    assert means(replace(TASK, checkpoint_step=100)) is ExitMeans.FINISHED  # resumed from the final one
    assert means(running=True) is ExitMeans.NOTHING  # rank 0's final report may follow
    decision = exit_means(TASK, CLEAN, 100, False, False)
    assert decision.means is ExitMeans.STATE_LOST and "none saving the final state" in decision.why


def test_failures_early_exits_and_exits_of_an_ended_task() -> None:
    assert means(report=CLEAN.model_copy(update={"code": 1})) is ExitMeans.FAILED
    # Once the final state is saved, a worker dying on its way out fails nothing: finished, said.
    aborted = CLEAN.model_copy(update={"code": None, "signal": 6})
    decision = exit_means(replace(TASK, digest="d"), aborted, 100, True, False)
    assert decision.means is ExitMeans.FINISHED and "signal 6 after the final state was saved" in decision.why
    assert means(replace(TASK, step=50, digest="d"), aborted) is ExitMeans.FAILED  # not at the end yet
    assert means(replace(TASK, step=50)) is ExitMeans.LEFT_EARLY
    ended = replace(TASK, state=TaskState.FINISHED)
    assert means(ended, CLEAN.model_copy(update={"code": 1}), open_=True) is ExitMeans.SCOPE
    assert (
        means(ended, CLEAN.model_copy(update={"code": 1})) is ExitMeans.NOTHING
    )  # no incident to tell about
    stopped = CLEAN.model_copy(update={"signal": 15, "code": None, "stop_ordered": True})
    assert means(ended, stopped, open_=True) is ExitMeans.NOTHING  # our own stop


def test_a_generation_that_leaves_without_the_final_state_is_trained_again_not_finished(make: Any) -> None:
    cluster = make(recovery="restart")
    cluster.train(100)
    for rank in range(4):  # every rank leaves cleanly after the last step; no final state saved
        cluster.exit(rank, code=0)
    task = cluster.c.store.get_task("lm")
    assert task.state is not TaskState.FINISHED and task.digest is None
    (incident,) = cluster.events("incident")
    assert "none saving the final state" in incident["why"], incident
    for _ in range(30):
        cluster.step()
    assert cluster.c.store.get_task("lm").generation > 1  # launched again from the checkpoint
    assert [e["resume_from"] for e in cluster.events("task_launch")][-1] == 0


def test_a_worker_dying_on_its_way_out_after_the_final_state_is_saved_fails_nothing(make: Any) -> None:
    """Rank 0 reports the final state saved, then dies of a signal in its teardown (seen once:
    SIGABRT after a reattempt in place): the task is finished, the others stopped, the death said
    in a ``late_failure`` event; no incident, no generation re-formed."""
    cluster = make()
    cluster.train(100)
    generation = cluster.c.store.get_task("lm").generation
    cluster.beat("n0", DoneReport(task="lm", generation=generation, rank=0, step=100, digest="d"))
    cluster.exit(0, code=None, signal=6)
    task = cluster.c.store.get_task("lm")
    assert task.state is TaskState.FINISHED and task.generation == generation
    assert not cluster.events("incident")
    stops = [o for _, o in cluster.orders if isinstance(o, StopWorkers) and o.generation == generation]
    assert stops  # the others, still on their way out, are stopped
    (late,) = cluster.events("late_failure")
    assert late["rank"] == 0 and "signal 6 after the final state was saved" in late["why"]

"""Where a worker's report goes (``brain/routing.py:route``): the order of the questions as a
table on hand-built values, and, over random reports and generations, that nothing of a
generation that is gone is taken for the current one's."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from unicron.brain.records import TaskRecord
from unicron.brain.routing import CURRENT, Route, Subject, route
from unicron.core.protocol import (
    SPARE_GENERATION,
    CheckpointReport,
    DoneReport,
    ExceptionReport,
    ExitReport,
    FaultReport,
    IterationReport,
    LaunchFailedReport,
    NumericalReport,
    RestoredReport,
    StacksReport,
    StorageReport,
    WorkerReport,
)
from unicron.core.states import TaskState

TASK = TaskRecord(
    "lm", "{}", TaskState.RUNNING, 5, 2, 40, 30, 0, 0, 0, None, 0.0, 0, 0.0, None, 0.0, 0.0, None, None, 5, 0
)
TAKEN = Subject(refusal=None, task=TASK, iterations=100)


def reports(generation: int) -> list[WorkerReport]:
    """One report of each kind a rank of ``generation`` sends, on node n0."""
    at = {"task": "lm", "generation": generation, "rank": 1}
    return [
        IterationReport(**at, step=41, duration_s=0.1, samples=8),
        FaultReport(**at, step=41, action="crash", time=1.0),
        ExceptionReport(**at, step=41, kind="cuda_error", error_type="RuntimeError", message="x"),
        LaunchFailedReport(**at, node="n0", error="no such file"),
        CheckpointReport(**at, step=40, path="/c/40"),
        RestoredReport(**at, step=40, source="persistent", path="/c/40"),
        ExitReport(**at, node="n0", code=1, signal=None),
        StorageReport(**at, step=40, tier="persistent", ok=False),
        DoneReport(**at, step=100, digest="d"),
        StacksReport(task="lm", generation=generation, node="n0", stacks={1: "frame"}),
        NumericalReport(**at, step=41, verdict="transient", ranks=[1], why="computed again, finite"),
    ]


def routes(generation: int, subject: Subject = TAKEN) -> dict[str, Route]:
    return {r.type: route(r, subject).route for r in reports(generation)}


def test_the_current_generation_s_reports_each_go_to_their_handler() -> None:
    assert routes(5) == {
        "iteration": Route.STEP,
        "fault": Route.INJECTED,
        "exception": Route.EXCEPTION,
        "launch_failed": Route.LAUNCH_FAILED,
        "checkpoint": Route.CHECKPOINT,
        "restored": Route.RESTORED,
        "exit": Route.EXIT,
        "storage": Route.STORAGE,
        "done": Route.NOT_FINAL,  # rank 1's: the final state is rank 0's to report
        "stacks": Route.STACKS,
        "numerical": Route.NUMERICAL,
    }
    final = DoneReport(task="lm", generation=5, rank=0, step=100, digest="d")
    assert route(final, TAKEN).route is Route.FINAL_STATE
    assert route(final.model_copy(update={"step": 99}), TAKEN).route is Route.NOT_FINAL


def test_a_generation_that_is_gone_keeps_its_steps_its_faults_and_its_final_state_and_nothing_else() -> None:
    gone = routes(4)
    assert gone.pop("iteration") is Route.KEPT_STEP  # micro-batches finished before the task moved on
    assert gone.pop("fault") is Route.INJECTED_NOT_CURRENT  # it struck: recorded, though its report came late
    assert gone.pop("numerical") is Route.NUMERICAL  # a passing fault: recorded, though the task moved on
    assert gone.pop("storage") is Route.STORAGE and gone.pop("stacks") is Route.STACKS  # the task's own
    assert set(gone.values()) == {Route.STALE}
    final = DoneReport(task="lm", generation=4, rank=0, step=100, digest="d")
    assert route(final, TAKEN).route is Route.FINAL_STATE  # saved before a grow it never saw
    later = routes(6)  # a generation not (yet) the task's: no step of it is kept
    assert later.pop("fault") is Route.INJECTED_NOT_CURRENT
    assert later.pop("numerical") is Route.NUMERICAL
    assert later.pop("storage") is Route.STORAGE and later.pop("stacks") is Route.STACKS
    assert set(later.values()) == {Route.STALE}


def test_what_is_asked_first_wins() -> None:
    refused = replace(TAKEN, refusal="rank 1 runs on node n1, not on node n0")
    assert set(routes(5, refused).values()) == {Route.REFUSED}  # a forgery changes nothing
    spare = ExitReport(task="lm", generation=SPARE_GENERATION, rank=0, node="n0", code=0, signal=None)
    assert route(spare, TAKEN).route is Route.SPARE_EXITED
    assert route(spare, replace(TAKEN, task=None)).route is Route.SPARE_EXITED  # a spare is no task's
    assert set(routes(5, replace(TAKEN, task=None)).values()) == {Route.NO_TASK}
    growing = replace(TAKEN, growing=6)
    exit6 = ExitReport(task="lm", generation=6, rank=2, node="n0", code=None, signal=9)
    assert route(exit6, growing).route is Route.NEWCOMER_EXITED  # before it is found stale
    assert routes(6, growing)["iteration"] is Route.STALE  # only an exit ends the grow


def test_an_exit_under_the_identity_a_worker_left_is_its_successor_s() -> None:
    moved = ExitReport(task="lm", generation=4, rank=3, node="n0", code=None, signal=9)
    routed = route(moved, replace(TAKEN, successor=(5, 1)))
    assert routed.route is Route.EXIT
    assert isinstance(routed.report, ExitReport) and (routed.report.generation, routed.report.rank) == (5, 1)
    assert route(moved, TAKEN).route is Route.STALE  # not renamed: a worker of the gone generation


CURRENT_ROUTES = {current for _, current in CURRENT}


@given(
    st.integers(1, 9),
    st.integers(1, 9),
    st.sampled_from(range(11)),
    st.none() | st.integers(1, 9),
    st.none() | st.integers(0, 3),
    st.booleans(),
)
def test_only_the_current_generation_reaches_the_current_handlers(
    task_generation: int,
    generation: int,
    kind: int,
    growing: int | None,
    renamed_to: int | None,
    refused: bool,
) -> None:
    task = replace(TASK, generation=task_generation)
    # A successor is always an identity in the task's current generation (``Reports._successor``).
    successor = None if renamed_to is None else (task_generation, renamed_to)
    subject = Subject("forged" if refused else None, task, 100, growing, successor)
    report = reports(generation)[kind]
    routed = route(report, subject)
    if refused:
        assert routed.route is Route.REFUSED
    if routed.route in CURRENT_ROUTES:
        assert routed.report.generation == task_generation
    if routed.report != report:  # renamed: an exit, to its successor
        assert routed.route is Route.EXIT and (routed.report.generation, routed.report.rank) == successor

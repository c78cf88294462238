"""Where a worker's report goes: one pure function of the report and what the coordinator knows
of its subject.

A report reaches the coordinator in its node's heartbeat. What it means depends on whose
generation it speaks for, and the order of the questions matters: a refused report changes nothing
however it reads; a hot spare's exit is no task's; a newcomer's exit ends its grow before the
task's generation is compared; a step of a generation just left keeps its micro-batches; a fault
injected in another generation struck all the same; the final state counts whichever generation
saved it; anything else of a generation that is gone is stale. :func:`route` asks them in that
order and returns the answer as a value, so the order is tested as a table
(``tests/test_routing.py``) and the coordinator's ``control/reports.py`` only carries each route
out.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from unicron.brain.records import TaskRecord
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


class Route(Enum):
    """What is done with a report."""

    REFUSED = "refused"  # its sender does not host its subject: recorded, nothing else
    SPARE_EXITED = "spare_exited"  # a hot spare ended: the spare is dropped
    NO_TASK = "no_task"  # it names a task that is not live: ignored
    STACKS = "stacks"  # a stack dump: to the peer check that asked, else to the hang's incident
    STORAGE = "storage"  # a checkpoint write failed: to the storage watch
    NEWCOMER_EXITED = "newcomer_exited"  # a grow's newcomer ended before joining: the grow ends
    KEPT_STEP = "kept_step"  # a step of a generation the task just left: its micro-batches count
    # A fault the run's injection struck in a generation not the task's when its report came
    # (held while the coordinator was away, overtaken by a change, a grow's newcomer): it struck,
    # so it is recorded; it times no detection (the generation it would time is not current)
    INJECTED_NOT_CURRENT = "injected_not_current"
    FINAL_STATE = "final_state"  # rank 0 saved the final state, in whichever generation
    STALE = "stale"  # from a generation that is gone: ignored
    STEP = "step"  # a step of the current generation
    INJECTED = "injected"  # a fault the run's own injection struck
    EXCEPTION = "exception"  # a rank raised
    LAUNCH_FAILED = "launch_failed"  # a rank could not be started
    CHECKPOINT = "checkpoint"  # a checkpoint was saved
    RESTORED = "restored"  # a rank restored its state: where it came from
    EXIT = "exit"  # a rank's process ended
    # A rank's gradients were wrong once and the step went on, in whichever generation (a
    # recovery may have re-formed the task before the report arrived): recorded
    NUMERICAL = "numerical"
    # Done short of the final state (a rank but 0, or before the last step): the task's end is
    # rank 0's final report, and each rank's exit
    NOT_FINAL = "not_final"


@dataclass(frozen=True)
class Subject:
    """What the coordinator knows of a report's subject, read before the report is routed."""

    refusal: str | None  # why its sender may not report about it (``control/recover/admission.py``)
    task: TaskRecord | None  # the live task it names
    iterations: int  # the task's final step
    growing: int | None = None  # the generation of the task's grow under way, if any
    # The identity (generation, rank) the worker was renamed into in place, if it was: an exit
    # reported under the identity it left belongs to the one it took.
    successor: tuple[int, int] | None = None


@dataclass(frozen=True)
class Routed:
    route: Route
    report: WorkerReport  # as it is to be handled: an exit renamed to its successor's identity


CURRENT: tuple[tuple[type, Route], ...] = (
    (IterationReport, Route.STEP),
    (FaultReport, Route.INJECTED),
    (ExceptionReport, Route.EXCEPTION),
    (LaunchFailedReport, Route.LAUNCH_FAILED),
    (CheckpointReport, Route.CHECKPOINT),
    (RestoredReport, Route.RESTORED),
    (ExitReport, Route.EXIT),
)


def route(report: WorkerReport, subject: Subject) -> Routed:
    """Where ``report`` goes, given what is known of its subject."""
    if subject.refusal is not None:
        return Routed(Route.REFUSED, report)
    if isinstance(report, ExitReport) and report.generation == SPARE_GENERATION:
        return Routed(Route.SPARE_EXITED, report)
    task = subject.task
    if task is None:
        return Routed(Route.NO_TASK, report)
    if isinstance(report, StacksReport):
        return Routed(Route.STACKS, report)
    if isinstance(report, StorageReport):
        return Routed(Route.STORAGE, report)
    if isinstance(report, ExitReport):
        if report.generation == subject.growing:
            return Routed(Route.NEWCOMER_EXITED, report)
        if report.generation != task.generation and subject.successor is not None:
            generation, rank = subject.successor
            report = report.model_copy(update={"generation": generation, "rank": rank})
    if isinstance(report, IterationReport) and report.generation < task.generation:
        return Routed(Route.KEPT_STEP, report)
    if isinstance(report, FaultReport) and report.generation != task.generation:
        return Routed(Route.INJECTED_NOT_CURRENT, report)
    if isinstance(report, NumericalReport):
        return Routed(Route.NUMERICAL, report)
    if isinstance(report, DoneReport) and report.rank == 0 and report.step >= subject.iterations:
        # The final state is saved, whichever generation saved it (the members may have
        # finished before a grow they never saw was committed).
        return Routed(Route.FINAL_STATE, report)
    if report.generation != task.generation:
        return Routed(Route.STALE, report)
    for kind, current in CURRENT:
        if isinstance(report, kind):
            return Routed(current, report)
    return Routed(Route.NOT_FINAL, report)

"""A task past its last step whose workers do not exit.

After the last step the workers save the final state and exit; hang detection stands aside
(there is no next step to be late). A worker that then never exits (hung in the final save, in
the process group's teardown, in an exit hook) kept its task running and its slots taken for
ever. Its exit is due within ``hang_cap_s`` of the last step's end, the longest any step may
take: as for any step, a save seen in progress holds that off by up to
``checkpoint_allowance_s``, and while the task's checkpoint storage is failing the final state
waits ``storage_wait_s`` more for it (``train/saving.py``), so that is allowed too.

The overdue workers are then handled as their exits would have been (``exits.py``): with the
final state known saved (rank 0's digest, or a checkpoint of the last step) the task is finished
and they are stopped; without it they are killed and the task is relaunched from its newest
checkpoint, the steps since trained again rather than lost.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from unicron.control.context import Context
from unicron.control.detect.detection import Detector
from unicron.control.recover.exits import final_state_saved
from unicron.control.recover.recovery import Recovery
from unicron.control.store.records import TaskRecord, WorkerRecord
from unicron.core.settings import Settings
from unicron.core.states import TaskState
from unicron.core.taxonomy import ErrorKind, Scope


@dataclass(frozen=True)
class Overdue:
    """Workers still running past the time their exits were due."""

    ranks: tuple[int, ...]
    waited_s: float  # since the last step ended (or its save was last seen, within the allowance)
    allowed_s: float
    final_saved: bool  # the task is finished whatever became of them


def allowed_s(limits: Settings, storage_failing: bool) -> float:
    """How long after its last step a task's workers may take to exit: the longest a step may
    take, one heartbeat for the exit's report to arrive, and the final state's wait for failing
    storage while it fails."""
    wait = limits.storage_wait_s if storage_failing else 0.0
    return limits.hang_cap_s + limits.heartbeat_interval_s + wait


def overdue(
    task: TaskRecord, live: Sequence[WorkerRecord], since: float, now: float, allowed: float, iterations: int
) -> Overdue | None:
    """The ``live`` workers of a running ``task`` past its last step, once ``allowed`` seconds
    have passed ``since`` its last step ended; None before (or with none left); pure."""
    if task.state is not TaskState.RUNNING or task.step < iterations or not live or now - since <= allowed:
        return None
    saved = final_state_saved(task, iterations)
    return Overdue(tuple(sorted(w.rank for w in live)), round(now - since, 3), allowed, saved)


@dataclass
class Tail:
    """Judges the exits of running tasks past their last step, once per tick."""

    ctx: Context
    detector: Detector
    recovery: Recovery
    storage_failing: Callable[[str], bool]  # the task's checkpoint storage has an open incident
    finish: Callable[[TaskRecord], None]  # the coordinator's ending of a finished task

    def check(self, task: TaskRecord, now: float) -> None:
        iterations = self.ctx.spec(task.name).run.iterations
        key = (task.name, task.generation)
        if task.step < iterations or self.detector.standing_aside(key, now) or key in self.recovery.incidents:
            return  # still training; or not to be judged now (as a late step); or being handled
        monitor = self.detector.monitor(task.name, task.generation)
        monitor.watch_from(now, task.step)  # a successor counts from its start
        live = self.ctx.store.workers(task.name, task.generation, live=True)
        allowed = allowed_s(self.ctx.limits, self.storage_failing(task.name))
        found = overdue(task, live, monitor.since, now, allowed, iterations)
        if found is None:
            return
        self.ctx.act.dump_stacks(task.name, task.generation, None)  # where they hang, for the user
        self.ctx.act.record(
            "exit_overdue",
            task=task.name,
            generation=task.generation,
            step=task.step,
            ranks=list(found.ranks),
            waited_s=found.waited_s,
            allowed_s=found.allowed_s,
            final_saved=found.final_saved,
        )
        if found.final_saved:
            self.finish(task)
            return
        for worker in live:
            self.ctx.act.stop_worker(worker, 0.0)
        why = f"rank(s) {list(found.ranks)} still running {found.waited_s:g} s after the last step, unsaved"
        self.recovery.incident(
            task.name, ErrorKind.TASK_HANG, live[0].node, why, set(found.ranks), monitor.since, Scope.TASK
        )
        if (incident := self.recovery.incidents.get(key)) is not None:
            self.detector.hang_incidents[key] = incident.id  # the stacks are the incident's

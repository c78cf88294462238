"""A task past its last step whose workers do not exit.

After the last step the workers save the final state and exit; hang detection stands aside
(there is no next step to be late). A worker that then never exits (hung in the final save, in
the process group's teardown, in an exit hook) kept its task running and its slots taken for
ever. Its exit is due within ``hang_cap_s`` of the last step's end, the longest any step may
take: as for any step, a save seen in progress holds that off by up to
``checkpoint_allowance_s``, and while the task's checkpoint storage is failing the final state
waits ``storage_wait_s`` more for it (``train/saving.py``), so that is allowed too.

The overdue workers are then handled as their exits would have been (``recover/exits.py``): with
the final state known saved (rank 0's digest, or a checkpoint of the last step) the task is
finished (:class:`Finished`) and they are stopped; without it they are killed and the task fails
(a :class:`Failing` for recovery), to be relaunched from its newest checkpoint, the steps since
trained again rather than lost.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from unicron.brain.records import TaskRecord, WorkerRecord
from unicron.control.context import Context
from unicron.control.detect.detection import Detector, Failing
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


def allowed_s(limits: Settings, interval_s: float, storage_failing: bool) -> float:
    """How long after its last step a task's workers may take to exit: the longest a step may
    take, one heartbeat for the exit's report to arrive, and the final state's wait for failing
    storage while it fails."""
    wait = limits.storage_wait_s if storage_failing else 0.0
    return limits.hang_cap_s + interval_s + wait


def overdue(
    task: TaskRecord, live: Sequence[WorkerRecord], since: float, now: float, allowed: float, iterations: int
) -> Overdue | None:
    """The ``live`` workers of a running ``task`` past its last step, once ``allowed`` seconds
    have passed ``since`` its last step ended; None before (or with none left); pure."""
    if task.state is not TaskState.RUNNING or task.step < iterations or not live or now - since <= allowed:
        return None
    saved = task.final_state_saved(iterations)
    return Overdue(tuple(sorted(w.rank for w in live)), round(now - since, 3), allowed, saved)


@dataclass(frozen=True)
class Finished:
    """The task's final state is saved: it is finished, whatever became of its last workers."""

    task: str


@dataclass
class Tail:
    """Judges the exits of running tasks past their last step, once per tick."""

    ctx: Context
    detector: Detector

    def check(self, task: TaskRecord, now: float, storage_failing: bool) -> Finished | Failing | None:
        """``storage_failing``: the task's checkpoint storage has an open incident (the final
        state waits for it)."""
        iterations = self.ctx.spec(task.name).run.iterations
        key = (task.name, task.generation)
        handled = self.detector.handled.has_incident(key)
        if task.step < iterations or self.detector.standing_aside(key, now) or handled:
            return None  # still training; or not to be judged now (as a late step); or being handled
        monitor = self.detector.monitor(task.name, task.generation)
        monitor.watch_from(now, task.step)  # a successor counts from its start
        live = self.ctx.store.workers(task.name, task.generation, live=True)
        interval = self.ctx.pace.judged(now).interval_s
        allowed = allowed_s(self.ctx.limits, interval, storage_failing)
        found = overdue(task, live, monitor.since, now, allowed, iterations)
        if found is None:
            return None
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
            return Finished(task.name)
        for worker in live:
            self.ctx.act.stop_worker(worker, 0.0)
        why = f"rank(s) {list(found.ranks)} still running {found.waited_s:g} s after the last step, unsaved"
        ranks, node = frozenset(found.ranks), live[0].node
        return Failing(
            task.name,
            task.generation,
            ErrorKind.TASK_HANG,
            node,
            why,
            ranks,
            monitor.since,
            Scope.TASK,
            hang=True,
        )

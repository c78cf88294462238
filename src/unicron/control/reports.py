"""What the workers report, and what detection finds, handed to the parts that act on it.

A report comes in a node's heartbeat (``Coordinator.heartbeat``) or, for a worker whose process is
gone unreported, from the sweep (``detect/vanished.py``). It is admitted only from the node that
hosts its worker (``recover/admission.py``), then routed by what it is and whose generation it
belongs to (``brain/routing.py:route``, a pure function of the report and what is known of its
subject): a step to ``stepping.py``, a failure (an exception, an exit, a launch that failed) to
``recover/recovery.py`` as an incident, a checkpoint or a storage fault to the storage watch, a
peer check's stacks to detection. Detection's verdicts (``Failing``, ``Judged``) go to recovery the
same way. What ends a task is carried out by the applier, which hands the ended task to the
coordinator to free (``Applier.next_ended``).
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Any

from unicron.brain.records import TaskRecord
from unicron.brain.routing import Route, Subject, route
from unicron.control.context import Context
from unicron.control.detect import reported
from unicron.control.detect.detection import Detector, Failing, Judged
from unicron.control.detect.mends import Mends, names_a_device
from unicron.control.place.placing import Placer
from unicron.control.recover.admission import refusal
from unicron.control.recover.attribution import Attribution, Sign
from unicron.control.recover.exits import ExitMeans, exit_means
from unicron.control.recover.generations import Generations
from unicron.control.recover.recovery import CONSEQUENCES, Recovery
from unicron.control.recover.storagewatch import StorageWatch
from unicron.control.stepping import Steps
from unicron.core.livespecs import NOT_FAILURES, NUMERICAL
from unicron.core.protocol import (
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
from unicron.core.states import TaskState, WorkerPhase
from unicron.core.taxonomy import ErrorKind, Scope, error_kind

EXITED = ErrorKind.EXITED_ABNORMALLY
PASSING_KEPT = 1024  # passing numerical faults remembered, so that one sent again is recorded once
# Signals a program does not die of by its own doing (it is killed: the OOM killer, an operator,
# a peer's agent): a fresh launch's worker killed by one is no sign of the program's fault.
KILLED_FROM_OUTSIDE = frozenset({signal.SIGKILL, signal.SIGTERM})


def end_task(ctx: Context, name: str, state: TaskState, event: str, **detail: Any) -> None:
    """End a task (finished or cancelled) and record why; the coordinator then frees it."""
    ctx.act.task_ended(name, state, ctx.clock())
    ctx.act.record(event, task=name, **detail)


@dataclass
class Reports:
    ctx: Context
    detector: Detector
    recovery: Recovery
    generations: Generations
    placer: Placer
    steps: Steps
    storage: StorageWatch
    signs: Attribution

    def __post_init__(self) -> None:
        self.store, self.act, self.clock = self.ctx.store, self.ctx.act, self.ctx.clock
        # The passing numerical faults recorded lately (an ordered set: the oldest forgotten).
        self.passing_seen: dict[tuple[str, int, int, int], None] = {}
        self.limits, self.spec = self.ctx.limits, self.ctx.spec
        self.mends = Mends(self.limits.isolate_after, self.limits.escalation_window_s)

    def handle(self, report: WorkerReport, node: str) -> bool:
        """A report from ``node``'s agent about one of its workers, carried out where
        ``brain/routing.py:route`` sends it: whether the plan should be looked at again (a slot
        freed, a task that started training or grew back)."""
        subject = self._subject(report, node)
        routed = route(report, subject)
        match routed.route, routed.report, subject.task:
            case Route.REFUSED, _, _:
                self._refused(report, node, subject.refusal)
            case Route.SPARE_EXITED, ExitReport() as spare, _:
                self.placer.drop_spare((spare.task, spare.rank), stop=False)
            case Route.STACKS, StacksReport() as stacks, _:
                self._stacks(stacks)
            case Route.STORAGE, StorageReport() as failed, TaskRecord() as task:
                self.storage.report(task, failed, node)
            case Route.NEWCOMER_EXITED, ExitReport() as exited, _:
                self.generations.newcomer_exited(exited)
                return True  # its slot is free for the next plan
            case Route.KEPT_STEP, IterationReport() as step, TaskRecord() as task:
                self.steps.kept(task, step)
            case Route.INJECTED_NOT_CURRENT, FaultReport() as fault, _:
                reported.injected(self.act, fault, node)
            case Route.FINAL_STATE, DoneReport() as done, _:
                self.act.task_done(done.task, done.step, done.digest)
            case Route.NUMERICAL, NumericalReport() as found, _:
                key = (found.task, found.generation, found.rank, found.step)
                if key not in self.passing_seen:  # (an agent may send a batch again)
                    self.passing_seen[key] = None
                    if len(self.passing_seen) > PASSING_KEPT:
                        del self.passing_seen[next(iter(self.passing_seen))]
                    reported.passing_fault(self.act, found, node, self.clock())
                    self._mended_on(found, node)
            case Route.NO_TASK | Route.STALE | Route.NOT_FINAL, _, _:
                pass
            case current, report_now, TaskRecord() as task:
                return self._current(current, task, report_now, node)
        return False

    def _mended_on(self, found: NumericalReport, node: str) -> None:
        """A fault of the device of a rank on ``node``, undone in the step: counted against the
        node, which is taken out once they reach the limit (``detect/mends.py``)."""
        if not names_a_device(found):
            return
        now = self.clock()
        count = self.mends.note(node, now)
        self.act.keep(self.mends.kept())
        task = self.store.task(found.task)
        if count is None or task is None:
            return
        ranks = frozenset(
            w.rank for w in self.store.workers(task.name, task.generation, live=True) if w.node == node
        )
        if not ranks:
            return  # none of the task's workers is there now: another failure took them out
        why = (
            f"its ranks' wrong numbers undone in the step {count} times within "
            f"{self.limits.escalation_window_s:g} s (the last: rank {found.rank}, {found.outcome}: "
            f"{found.why}): a device that keeps computing wrong values"
        )
        kind, scope = ErrorKind.SILENT_DATA_CORRUPTION, Scope.NODE
        self.failing(Failing(task.name, task.generation, kind, node, why, ranks, found.time or now, scope))

    def _subject(self, report: WorkerReport, node: str) -> Subject:
        """What the store and the parts know of ``report``'s subject."""
        task = self.store.task(report.task)
        successor = None
        if isinstance(report, ExitReport) and task is not None:
            successor = self._successor(task, report)
        growth = self.generations.growing.get(report.task)
        return Subject(
            refusal=refusal(report, node, self.store),
            task=task,
            iterations=0 if task is None else self.spec(task.name).run.iterations,
            growing=None if growth is None else growth.generation,
            successor=successor,
        )

    def _stacks(self, report: StacksReport) -> None:
        if self.detector.stacks_reported(report):
            self.judged(self.detector.judge_checks(self.clock()))
            return  # it answers a peer check, which records it with its verdict
        incident = self.detector.hang_incident((report.task, report.generation))
        reported.stacks(self.act, report, incident)  # ordered for a generation now usually gone

    def _current(self, routed: Route, task: TaskRecord, report: WorkerReport, node: str) -> bool:
        """A report of the task's current generation, carried out as ``routed`` (the class
        patterns only type the report the route names)."""
        match routed, report:
            case Route.STEP, IterationReport() as step:
                return self.steps.completed(task, step)  # the plan may want the task larger or smaller now
            case Route.INJECTED, FaultReport() as fault:
                if fault.action not in NOT_FAILURES | NUMERICAL:
                    self.recovery.injected((fault.task, fault.generation), fault.time)
                reported.injected(self.act, fault, node)
            case Route.EXCEPTION, ExceptionReport() as raised:
                self._exception(task, raised, node)
            case Route.LAUNCH_FAILED, LaunchFailedReport() as failed:
                self.act.worker_phase((failed.task, failed.generation, failed.rank), WorkerPhase.FAILED)
                if task.state.active:
                    why = f"rank {failed.rank} on {node} could not be started: {failed.error}"
                    self.recovery.incident(
                        task.name, ErrorKind.USER_ERROR, node, why, seen_at=failed.time or None
                    )
            case Route.CHECKPOINT, CheckpointReport() as saved if saved.rank == 0:
                self.act.task_checkpointed(saved.task, saved.step)
                self.storage.persisted(saved.task, saved.step)
            case Route.RESTORED, RestoredReport() as restored:
                reported.restored(self.act, restored, node)
            case Route.EXIT, ExitReport() as exited:
                self.exit(task, exited)
        return False

    def _refused(self, report: WorkerReport, node: str, why: str | None) -> None:
        """A refused report is recorded, with why (``admission.py``), and changes nothing else."""
        rank = None if isinstance(report, StacksReport) else report.rank
        self.act.record(
            "report_rejected", task=report.task, node=node, report=report.type, rank=rank, why=why
        )

    def _successor(self, task: TaskRecord, report: ExitReport) -> tuple[int, int] | None:
        """The identity a worker was moved into in place (same node, same process), if it was:
        an exit reported under the generation it left belongs to it."""
        row = self.store.worker(report.task, report.generation, report.rank)
        if row is None or row.state is not WorkerPhase.MOVED or row.pid is None:
            return None
        for w in self.store.workers(task.name, task.generation, live=True):
            if w.node == row.node and w.pid == row.pid:
                return w.generation, w.rank
        return None

    def _exception(self, task: TaskRecord, report: ExceptionReport, node: str) -> None:
        kind = error_kind(report.kind)
        self.act.record(
            "exception",
            task=report.task,
            node=node,
            rank=report.rank,
            step=report.step,
            kind=kind.value,
            error=f"{report.error_type}: {report.message}"[:500],
        )
        if not task.state.active:
            if self.recovery.has_incident((task.name, task.generation)) and kind not in CONSEQUENCES:
                sign = Sign(self.clock(), kind, node, report.generation)
                self.signs.note(task.name, sign)  # the same fault elsewhere
            return
        if kind in CONSEQUENCES and self.spec(task.name).run.recovery == "in_process":
            self.recovery.peer_error(task.name, task.generation, kind, node, report.rank, report.time or None)
        else:
            why, seen = f"rank {report.rank} raised {report.error_type}", report.time or None
            failed, gen = {report.rank}, report.generation
            self.recovery.incident(task.name, kind, node, why, failed, seen, generation=gen)

    def exit(self, task: TaskRecord, report: ExitReport) -> None:
        key = (report.task, report.generation, report.rank)
        ok = report.code == 0
        # Ended by a signal our own stop order sent (a worker of a finished task still exiting,
        # a generation stopped by the plan): stopped, not failed, as the agent counts it.
        stopped = report.stop_ordered and report.signal is not None
        phase = WorkerPhase.EXITED if ok else WorkerPhase.STOPPED if stopped else WorkerPhase.FAILED
        self.act.worker_phase(key, phase, code=report.code, signal=report.signal)
        running = bool(self.store.workers(report.task, report.generation, live=True))
        open_ = self.recovery.has_incident((task.name, task.generation))
        decision = exit_means(task, report, self.spec(task.name).run.iterations, running, open_)
        means, seen, why = decision.means, report.time or None, decision.why
        # Ended before its first step (the agent then sends its output's end): the incident,
        # its event and `unicron status` say where its output is and how it ended.
        output = None if report.log is None else {"log": report.log, "log_tail": report.log_tail or ""}
        if output is not None:
            why += f"; it completed no step (its output: {report.node}:{report.log})"
        if means is ExitMeans.SCOPE:  # the same failure striking more ranks
            self.signs.note(task.name, Sign(self.clock(), EXITED, report.node, report.reached or None))
        elif means is ExitMeans.FAILED:
            gone, killed = report.reached or None, report.signal in KILLED_FROM_OUTSIDE
            self.recovery.incident(
                task.name,
                EXITED,
                report.node,
                why,
                {report.rank},
                seen,
                generation=gone,
                killed=killed,
                detail=output,
            )
        elif means in (ExitMeans.LEFT_EARLY, ExitMeans.STATE_LOST):
            # The program chose to end (or was ended from outside): no node's fault.
            ranks = {report.rank} if means is ExitMeans.LEFT_EARLY else None
            self.recovery.incident(
                task.name, EXITED, report.node, why, ranks, seen, Scope.TASK, detail=output
            )
        elif means is ExitMeans.FINISHED:
            if decision.why and not report.stop_ordered:  # a failure after the final state was saved
                self.act.record("late_failure", task=task.name, node=report.node, rank=report.rank, why=why)
            self.finished(task)

    def finished(self, task: TaskRecord) -> None:
        """The final state is saved: what still runs of the task is stopped, and it ends."""
        self.ctx.act.stop_generation(task.name, task.generation, self.limits.stop_grace_s)
        end_task(self.ctx, task.name, TaskState.FINISHED, "task_finished", step=task.step, digest=task.digest)
        self.placer.stop_spares_of(task.name)

    def failing(self, found: Failing | None) -> None:
        """Detection found a generation failing: recovery opens its incident; a hang's stacks,
        reported later, are that incident's."""
        if found is None:
            return
        self.recovery.failing(found)
        key = (found.task, found.generation)
        if found.hang and (incident := self.recovery.open_incident(key)) is not None:
            self.detector.opened(key, incident)

    def judged(self, judged: list[Judged]) -> None:
        """Peer checks complete: the failure each found is recovered from, and the stacks it
        gathered are recorded with the generation's incident."""
        for check in judged:
            self.failing(check.failing)
            if (incident := self.recovery.open_incident(check.key)) is not None:
                self.detector.opened(check.key, incident)
            for report in check.stacks:
                reported.stacks(self.act, report, self.detector.hang_incident(check.key))

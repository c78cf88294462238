"""What each step a worker completes changes: the task's count of samples and weighted work,
the measured throughput (the planner's curves), the hang and straggler statistics, and, for a
task that was stopped, its return to training (its incidents recovered)."""

from __future__ import annotations

from dataclasses import dataclass

from unicron.brain.records import TaskRecord
from unicron.control.context import Context
from unicron.control.detect.detection import Detector
from unicron.control.place.placing import Placer
from unicron.control.place.rates import RateMeter
from unicron.control.recover.recovery import Recovery
from unicron.core.protocol import IterationReport
from unicron.core.states import TaskState, WorkerPhase
from unicron.planning.throughput import declares


@dataclass
class Steps:
    ctx: Context
    detector: Detector
    recovery: Recovery
    placer: Placer
    rates: RateMeter

    def weighted_flop(self, task: str, samples: int) -> float:
        """Weighted FLOP done by ``samples`` samples (WAF integrated over time)."""
        return self.ctx.spec(task).weight * (self.ctx.flops_per_sample(task) or 0.0) * samples

    def kept(self, task: TaskRecord, report: IterationReport) -> None:
        """A step a member finished in the generation it has since been moved out of (in place:
        the step was kept, not redone). Its samples are work done and count; the timing
        statistics belong to the current generation."""
        row = self.ctx.store.worker(report.task, report.generation, report.rank)
        if row is not None and row.state is WorkerPhase.MOVED:
            flop = self.weighted_flop(task.name, report.samples)
            self.ctx.act.count_iteration(
                task.name, report.generation, report.rank, report.step, report.samples, flop
            )

    def completed(self, task: TaskRecord, report: IterationReport) -> bool:
        """A step of the task's current generation; whether the plan should be looked at again
        (the task just started training, or grew back after moving off a drained node)."""
        if report.recomputed:
            self.recovery.recomputed(report)
        monitor = self.detector.monitor(task.name, task.generation)
        for rank, slow in monitor.rank_compute(report.step, report.rank, report.compute_s, task.workers):
            self.ctx.act.record(
                "straggler" if slow else "straggler_recovered",
                task=task.name,
                rank=rank,
                step=report.step,
                generation=task.generation,
            )
        flop = self.weighted_flop(task.name, report.samples)
        ended = report.time or self.ctx.clock()
        if not self.ctx.act.count_iteration(
            task.name, task.generation, report.rank, report.step, report.samples, flop
        ):
            return False  # seen before (sent again after a coordinator restart)
        self._measure(task, report, ended)
        if report.rank != 0:
            return False
        monitor.step_done(report.step, ended)
        replan = task.name in self.placer.regrow  # its first step after a shrink off a drained node
        self.placer.regrow.discard(task.name)
        if task.state is TaskState.STARTING:
            replan = True
            self.detector.first_step_done(task, ended)
            downtime = self.ctx.act.task_running(task.name, self.ctx.clock())
            if downtime is not None:
                self.recovery.recovered(task.name, downtime, report)
            self.ctx.act.record(
                "task_running",
                task=task.name,
                generation=task.generation,
                workers=task.workers,
                step=report.step,
            )
        return replan

    def _measure(self, task: TaskRecord, report: IterationReport, ended: float) -> None:
        """Feed the rate meter; a new measurement rebuilds the plan table for it. A task that
        declares no throughput and whose FLOPs per sample are unknown is measured in samples/s
        (its scaling); one with a declared table is measured only with its FLOPs per sample."""
        sample_flops = self.ctx.flops_per_sample(task.name)
        if not sample_flops and declares(self.ctx.spec(task.name)):
            return
        rate = self.rates.report(
            task.name,
            task.generation,
            task.workers,
            report.step,
            report.rank,
            report.samples,
            ended,
            sample_flops,
        )
        if rate is not None:
            self.ctx.act.keep(self.rates.kept())
            if sample_flops:
                self.ctx.act.record("throughput_measured", task=task.name, workers=task.workers, flops=rate)
            else:
                self.ctx.act.record(
                    "throughput_measured", task=task.name, workers=task.workers, samples_per_s=rate
                )
            self.placer.inputs_changed()  # the plan may change with it, once its table is built

"""What a worker's exit means for its task: a pure decision over the task's record and the
agent's report, carried out by the coordinator (``Reports.exit``).

A clean exit is no proof of a finished task: a worker whose final commit was refused leaves with
status 0 too. So a task is finished only once the final state is known saved (rank 0's digest,
or a checkpoint of the last step); a generation that left without it is an incident, and the
steps since the newest checkpoint are trained again rather than lost.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from unicron.brain.records import TaskRecord
from unicron.core.protocol import ExitReport


class ExitMeans(Enum):
    NOTHING = "nothing"  # our own stop caused it, or more of the generation is still running
    SCOPE = "scope"  # a failure of an ended or stopping task striking more ranks: tells its scope
    FAILED = "failed"  # the worker failed (a status or a signal of its own)
    LEFT_EARLY = "left early"  # a clean exit before the last step: its peers cannot go on
    STATE_LOST = "state lost"  # every worker left after the last step, none saving the final state
    FINISHED = "finished"  # the final state is saved: what still runs is stopped


@dataclass(frozen=True)
class ExitDecision:
    means: ExitMeans
    why: str  # the incident's words, where it opens one (FINISHED: a death on the way out)


def exit_means(
    task: TaskRecord, report: ExitReport, iterations: int, others_running: bool, incident_open: bool
) -> ExitDecision:
    """``others_running``: workers of the report's generation still run; ``incident_open``: the
    task's current generation has an open incident."""
    ok, where = report.code == 0, f"rank {report.rank} on {report.node}"
    if not task.state.active:
        # An exit our own stop caused (killed, or ended cleanly on SIGTERM) tells nothing; a
        # failure of the program's own, also after a stop order came, does.
        caused = report.stop_ordered and (report.signal is not None or ok)
        scope = not ok and not caused and incident_open
        return ExitDecision(ExitMeans.SCOPE if scope else ExitMeans.NOTHING, "")
    if not ok and task.step >= iterations and task.final_state_saved(iterations):
        # The result is saved: a worker that dies on its way out (its teardown aborted: once, a
        # gloo group left behind by a recovery) fails nothing; there is nothing left to recover.
        return ExitDecision(
            ExitMeans.FINISHED, f"{where} {_how_it_ended(report)} after the final state was saved"
        )
    if not ok:
        return ExitDecision(ExitMeans.FAILED, f"{where} {_how_it_ended(report)}")
    if task.step < iterations:
        return ExitDecision(ExitMeans.LEFT_EARLY, f"{where} exited before the last step")
    if task.digest is None and others_running:
        return ExitDecision(ExitMeans.NOTHING, "")  # rank 0's report of the final state may follow
    if not task.final_state_saved(iterations):
        why = f"every worker exited after step {task.step}, none saving the final state"
        return ExitDecision(ExitMeans.STATE_LOST, why)
    return ExitDecision(ExitMeans.FINISHED, "")


def _how_it_ended(report: ExitReport) -> str:
    if report.signal:
        return f"exited with signal {report.signal}"
    if report.code is not None:
        return f"exited with code {report.code}"
    return "is gone, its status unknown (its node's agent no longer had it)"

"""Facts that workers and agents report, recorded as events for the operator: where a relaunched
task's state came from, every rank's stack at a hang, and each fault the library injected.
None changes what the coordinator decides; they are what an operator (or a benchmark) reads to
learn what happened."""

from __future__ import annotations

from typing import Any

from unicron.control.act.effects import Applier
from unicron.control.detect.hangs import innermost_frame
from unicron.core.protocol import FaultReport, NumericalReport, RestoredReport, StacksReport
from unicron.core.taxonomy import TAXONOMY, ErrorKind


def stacks(act: Applier, report: StacksReport, incident: int | None) -> None:
    """Every rank's Python stack at a hang, with the frame each main thread was in, recorded
    with the hang's ``incident`` (so it says where the task hung)."""
    act.record(
        "stacks",
        task=report.task,
        node=report.node,
        incident=incident,
        generation=report.generation,
        where={rank: innermost_frame(text) for rank, text in report.stacks.items()},
        stacks=report.stacks,
    )


def restored(act: Applier, report: RestoredReport, node: str) -> None:
    """Where a relaunched task's state came from; a newer copy passed over (unreadable, or not
    matching its digest) is an event of its own, naming the file and why."""
    where: dict[str, Any] = {"rank": report.rank, "generation": report.generation}
    if report.skipped:
        act.record(
            "checkpoint_corrupt",
            task=report.task,
            node=node,
            **where,
            skipped=[{"path": p, "why": why} for p, why in report.skipped],
            used=report.path,
            step=report.step,
        )
    if report.rank == 0 or report.skipped:
        act.record(
            "checkpoint_restored",
            task=report.task,
            node=node,
            **where,
            step=report.step,
            source=report.source,
        )


# What the ranks did about wrong numbers in a step that went on (``NumericalReport.outcome``).
OUTCOME_KINDS = {
    "recomputed": ErrorKind.NUMERICAL_TRANSIENT,
    "skipped": ErrorKind.NUMERICAL_SKIPPED,
    "applied": ErrorKind.GRADIENT_SPIKE,
    "repaired": ErrorKind.REPLICA_REPAIRED,
}
# How the ranks found and undid it, for the incident's ladder.
OUTCOME_LADDER = {
    "repaired": "found at the step boundary by the replicas' digests: the odd replica took the others' state",
}


def passing_fault(act: Applier, report: NumericalReport, node: str, now: float) -> None:
    """A rank's gradients were wrong (not finite, or a spike) in a step that its ranks then
    computed again, right, or whose data was at fault (its update skipped in a task that skips
    it, or, a spike, applied: ``train/numerics.py``): an incident the workers already recovered from in place
    (the tier they carried out: the step reattempted, no process restarted), recorded with its
    culprit and closed at once. It changes nothing of the task; one that blames a device is
    counted against its node, which repeats take out (``mends.py``)."""
    kind, outcome = OUTCOME_KINDS[report.outcome], report.outcome
    info = TAXONOMY[kind]
    incident = act.record(
        "incident",
        task=report.task,
        node=node,
        kind=kind.value,
        severity=info.severity.name,
        action=info.tier.label,
        asked=info.tier.label,
        scope=info.scope.value,
        why=f"rank {report.rank}: {report.why}",
        ladder=OUTCOME_LADDER.get(outcome, f"found in the step by the ranks, computed again: {outcome}"),
        detected_at=report.time or now,  # in the step it struck, before anything of it was applied
        generation=report.generation,
        step=report.step - 1,  # the last step completed, as every incident records it
        verdict=report.verdict,
        # The rank named, alone; none where several are (every rank's share was wrong, or none
        # alone: the reporting rank is only the first of them).
        culprit=report.rank if report.ranks == [report.rank] else None,
        ranks=report.ranks,
    )
    act.record(  # (no step lost: the one that struck is the one resumed, or was skipped)
        "outcome",
        task=report.task,
        incident=incident,
        outcome="recovered",
        downtime_s=report.spent_s,  # the step's time computing again: the ranks never stopped
        resumed_step=report.step + (report.outcome == "skipped"),
        action=info.tier.label,
        actions=[info.tier.label],
    )


def injected(act: Applier, report: FaultReport, node: str) -> None:
    """A fault the library injected (its index claims it once, also across a restart)."""
    act.record(
        "fault_injected",
        task=report.task,
        node=node,
        rank=report.rank,
        step=report.step,
        action=report.action,
        generation=report.generation,
        index=report.index,
    )

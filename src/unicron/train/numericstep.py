"""The numerical rung inside a step (issue 55): what the ranks do once the step's gradient sum
was found wrong (not finite, or a spike), nothing of it applied (``numerics.py``: the verdicts,
the tests).

The ranks whose own gradients were wrong are found; the step is computed again on the same
ranks (a right sum is written back: a passing fault, reported); then cross-checked (each rank
computes the samples of the rank before it, and the ranks tell each other whose gradients are
wrong; nothing is summed) until :func:`numerics.judge` has a verdict, which this module
carries out: this rank ends (a device at fault, or data wrong wherever computed), or it
goes on (in place, without a device that leaves). The step loop (``steploop.StepLoop``) does the
computing (:class:`Computing`); every rank takes the same branches, each decided by collectives.

Data at fault (or a fault that cannot be told from it) ends the task with its verdict where the
sum is not finite, and is applied where it is a spike (what the data gives: training without the
test would apply it), unless the task says to skip it (``run.on_bad_data: skip``): then the
step's update is skipped on every rank
(no optimizer step; the registered objects held as they were, as for a step copied from a
replica: ``noupdate.py``, but the registered schedulers step, as the step counts) and its
samples are recorded as skipped. Not twice within
``numerics.REPEAT_STEPS`` steps of one generation: data that keeps giving wrong numbers, or a
fault that follows every batch, ends the task rather than skip step after step.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Generator, Iterator
from dataclasses import replace
from typing import Any, Protocol

from unicron.core.limits import MAX_NOTE_CHARS, MAX_PEERS
from unicron.core.protocol import NumericalReport
from unicron.train import numerics
from unicron.train.channel import ReportChannel
from unicron.train.groups import Groups
from unicron.train.iteration import PeerLostError
from unicron.train.numerics import WrongSum
from unicron.train.tracefile import TraceFile


class Worker(Protocol):
    """What the rung asks of the training session (``session.Session``)."""

    task: str
    generation: int
    rank: int
    world_size: int
    groups: Groups
    channel: ReportChannel
    trace: TraceFile

    def recoverable(self, exc: Exception, last: bool) -> None:
        """Forward a failed collective; raise it where it cannot be recovered from in place."""
        ...


class Computing(Protocol):
    """What the rung asks of the step in progress."""

    @property
    def session(self) -> Worker: ...

    computed: list[int]  # the samples whose gradients this rank holds in the step
    passing: dict[int, tuple[int, int]]  # rank -> (generation, step) of its last passing fault
    skips: bool  # the task skips a step whose data is at fault (``run.on_bad_data: skip``)
    skipped: tuple[int, int] | None  # (generation, step) of the last step skipped

    def recompute(self, step: int, ids: list[int]) -> Iterator[Any]:
        """This rank's gradients of the step void, then ``ids`` computed again, up to the sum."""
        ...

    def reduce(self, spikes: bool = True) -> None:
        """The step's gradient sum (``WrongSum``: wrong, nothing written back; ``spikes``: False
        to take a spike)."""
        ...

    def own_wrong(self) -> bool:
        """Whether this rank's own gradients, as its share of the sum, are wrong."""
        ...


class Done(enum.Enum):
    """How the rung left the step, where it goes on without a peer's failure to recover from."""

    APPLIED = "applied"  # a right sum written back: the step goes on
    SKIPPED = "skipped"  # the data's fault, skipped (``run.on_bad_data: skip``): no update


def recover(
    loop: Computing, step: int, contributed: list[int], wrong: str, spike: bool, last: bool
) -> Generator[Any, None, Done | list[int]]:
    """The rung for a sum found ``wrong`` (how; ``spike``: finite, a spike), a peer's failure
    meanwhile recovered from as a failed sum's is: how the step goes on (:class:`Done`), else
    the samples whose gradients this rank holds, forwarded as a peer's failure (a suspect device
    leaving, or a peer lost), to rejoin with (``last``: the step's last attempt, or no
    in-process recovery: raised instead)."""
    session = loop.session
    try:
        held, done = yield from _rung(loop, step, contributed, wrong, spike)
    except (numerics.SilentDataCorruption, numerics.NumericalDataFault):
        raise  # this rank's verdict: it ends
    except Exception as exc:
        session.recoverable(exc, last=last)
        return list(loop.computed)
    if done is not None:
        return done
    session.recoverable(
        PeerLostError(f"a peer's device computes wrong values in step {step}: it leaves"), last=last
    )
    return held


def _rung(
    loop: Computing, step: int, contributed: list[int], wrong: str, spike: bool
) -> Generator[Any, None, tuple[list[int], Done | None]]:
    """Computed again, then cross-checked, until there is a verdict (the module's docstring).
    Returns the samples whose gradients this rank now holds, and how the step goes on: their sum
    written back (exact, or a spike the data gives), or the data's fault skipped; None: a
    suspect device is leaving and the others recover in place, as from a crash after their
    micro-batches. Raises the verdict where this rank is to end: a device at fault, or samples
    wrong wherever computed (every rank alike)."""
    session, world, rank = loop.session, loop.session.world_size, loop.session.rank
    found_at = (time.time(), time.monotonic())
    flagged = suspects(loop, all_if_none=False)  # (none: the sum itself overflowed, or spiked)
    first = flagged or frozenset(range(world))
    again: frozenset[int] | None = None
    cross: frozenset[int] | None = None
    mine = contributed
    shortcut = world > 1 and named_again_lately(loop, flagged, step)
    if shortcut:
        again = first  # no second chance: cross-checked at once
    while (judgement := numerics.judge(first, again, cross, world)) is None:
        if again is not None:  # the cross-check: the samples of the rank before this one
            assert session.groups.peers is not None  # (world > 1: judge decides alone for one)
            mine = session.groups.peers.gather_lists(contributed)[numerics.rotated(rank, world)]
        session.trace("numerical_recompute", step=step, samples=len(mine), cross=again is not None)
        yield from loop.recompute(step, mine)
        if again is not None:
            cross = suspects(loop, all_if_none=False)
            continue
        try:
            loop.reduce()
            again = frozenset()  # right, and written back
        except WrongSum:
            again = suspects(loop)
    if judgement.verdict is numerics.Verdict.TRANSIENT:
        loop.passing |= {r: (session.generation, step) for r in flagged}  # (not an overflow's fill)
    again_why = f"named in a passing fault within {numerics.REPEAT_STEPS} steps, then again: "
    judgement = replace(judgement, why=f"{wrong}; {again_why if shortcut else ''}{judgement.why}")
    outcome = outcome_of(loop, step, judgement.verdict, spike)
    if outcome is numerics.Outcome.APPLIED:
        try:
            loop.reduce(spikes=False)  # (every rank holds the gradients of its share of the samples)
        except WrongSum:
            outcome = numerics.Outcome.FAILED  # not finite this time: never applied
    judged(session, step, judgement, found_at, outcome)
    if outcome is numerics.Outcome.SKIPPED:
        loop.skipped = (session.generation, step)
        return mine, Done.SKIPPED
    return mine, None if outcome is numerics.Outcome.LEFT else Done.APPLIED


def outcome_of(loop: Computing, step: int, verdict: numerics.Verdict, spike: bool) -> numerics.Outcome:
    """What is done about ``verdict`` (every rank alike): a passing fault's sum is written back;
    a faulty device leaves; the data's fault is skipped where the task says so, else applied if
    it is a spike (what the data gives), else it ends the task."""
    if verdict is numerics.Verdict.TRANSIENT:
        return numerics.Outcome.RECOMPUTED
    if verdict is numerics.Verdict.DEVICE:
        return numerics.Outcome.LEFT
    if may_skip(loop, step):
        return numerics.Outcome.SKIPPED
    return numerics.Outcome.APPLIED if spike else numerics.Outcome.FAILED


def may_skip(loop: Computing, step: int) -> bool:
    """Whether the step whose data is at fault is skipped rather than ending the task: the task
    says so, and no step was skipped within ``REPEAT_STEPS`` steps of this generation (every
    member of a generation has seen the same skips)."""
    last = loop.skipped
    lately = (
        last is not None and last[0] == loop.session.generation and step - last[1] <= numerics.REPEAT_STEPS
    )
    return loop.skips and not lately


def named_again_lately(loop: Computing, flagged: frozenset[int], step: int) -> bool:
    """Whether every rank ``flagged`` (its own gradients wrong) was named in a passing
    fault lately (``numerics.repeated``), and the cross-check can tell about each (no two
    neighbours: each would check the other), every rank told: a rank that joined since knows of
    none, and all must take the same branch. A rank flagged for the first time, or beside
    another, gets its second computation."""
    session, world = loop.session, loop.session.world_size
    recent = numerics.repeated(flagged, loop.passing, session.generation, step)
    checkable = not any((r + 1) % world in flagged for r in flagged)
    go = bool(flagged) and recent == flagged and checkable
    assert session.groups.peers is not None  # (world > 1)
    return bool(session.groups.peers.max(1 if go else 0))


OUTCOME_WHY = {
    numerics.Outcome.SKIPPED: "; the step's update skipped (run.on_bad_data)",
    numerics.Outcome.APPLIED: "; a spike the data gives: applied (run.on_bad_data: skip skips it)",
}


def judged(
    session: Worker,
    step: int,
    judgement: numerics.Judgement,
    found_at: tuple[float, float],
    outcome: numerics.Outcome,
) -> None:
    """Record the verdict on a step whose sum was wrong (``found_at``: when, as Unix and
    monotonic time) and its ``outcome``, and end this rank where that says so. A step that goes
    on (a passing fault, a skipped step, a spike applied) is reported once, by the first rank
    named (its agent may only speak for it); one that ends, by the exception that ends the rank
    or the task."""
    judgement = replace(judgement, why=judgement.why + OUTCOME_WHY.get(outcome, ""))
    session.trace("numerical", step=step, verdict=judgement.verdict.value,
                  ranks=sorted(judgement.ranks), why=judgement.why, outcome=outcome.value)  # fmt: skip
    reported = outcome in (numerics.Outcome.RECOMPUTED, numerics.Outcome.SKIPPED, numerics.Outcome.APPLIED)
    if reported:
        report_undone(
            session, step, judgement.verdict.value, outcome, judgement.ranks, judgement.why, found_at
        )
    where = f"step {step}: {judgement.why}"
    if outcome is numerics.Outcome.FAILED:
        raise numerics.NumericalDataFault(f"wrong gradients in {where}")
    if judgement.verdict is numerics.Verdict.DEVICE and session.rank in judgement.ranks:
        raise numerics.SilentDataCorruption(f"this rank's device computes wrong values: {where}")


def report_undone(
    session: Worker,
    step: int,
    verdict: str,
    outcome: numerics.Outcome,
    ranks: frozenset[int],
    why: str,
    found_at: tuple[float, float],
) -> None:
    """Report wrong numbers the ranks undid in place (``NumericalReport``: an incident already
    closed), once: by the first rank named, since its agent may only speak for it."""
    if session.rank != min(ranks):
        return
    report = NumericalReport(
        task=session.task,
        generation=session.generation,
        rank=session.rank,
        step=step,
        verdict=verdict,
        outcome=outcome.value,
        ranks=sorted(ranks)[:MAX_PEERS],
        why=why[:MAX_NOTE_CHARS],
        time=found_at[0],
        spent_s=time.monotonic() - found_at[1],
    )
    session.channel.send(report)


def suspects(loop: Computing, all_if_none: bool = True) -> frozenset[int]:
    """The ranks whose own gradients are wrong, every rank told (after a sum that was wrong,
    ``all_if_none``: every rank where none's are: the sum itself overflowed, or its spike is
    no one rank's alone)."""
    session, world = loop.session, loop.session.world_size
    found = numerics.named(session.groups.peers, session.rank, world, loop.own_wrong())
    return found or (frozenset(range(world)) if all_if_none else found)

"""A generation-0 fault strikes in whichever worker first reaches its step, claimed through the
task's store (``train/faults.py``): decided here on a fake store's answers, in-process."""

from __future__ import annotations

import pytest

from unicron.core.livespecs import FaultSpec
from unicron.core.protocol import FaultReport
from unicron.train.faults import FaultInjector


def injector(answers: list[bool | None]) -> tuple[FaultInjector, list[FaultReport], list[int]]:
    """Rank 0 of generation 3, with one generation-0 error due at step 10; the store answers the
    claims with ``answers`` in turn (None: it did not answer)."""
    fault = FaultSpec(action="raise", rank=0, step=10, generation=0, message="injected")
    reports: list[FaultReport] = []
    asked: list[int] = []
    faults = FaultInjector([fault], rank=0, generation=3, report=reports.append, task="lm")

    def claim(index: int) -> bool | None:
        asked.append(index)
        return answers.pop(0)

    faults.claim = claim
    return faults, reports, asked


def test_a_fault_claimed_while_the_store_is_away_strikes_at_the_first_step_it_answers() -> None:
    faults, reports, asked = injector([None, None, True])
    faults.step_started(9)  # not due yet: nothing asked
    faults.step_started(10)  # due, the store away
    faults.step_started(11)  # still away
    with pytest.raises(RuntimeError, match="injected"):
        faults.step_started(12)  # it answers: this worker is first
    assert asked == [0, 0, 0] and [(r.step, r.generation) for r in reports] == [(12, 3)]


def test_a_fault_another_worker_claimed_is_never_asked_for_again() -> None:
    faults, reports, asked = injector([False])
    for step in (10, 11, 12):
        faults.step_started(step)
    assert asked == [0] and reports == []


def test_a_fault_at_an_event_whose_claim_the_store_did_not_answer_is_claimed_at_its_next_turn() -> None:
    fault = FaultSpec(action="stall_rejoin", rank=0, step=1, generation=0, seconds=0.0)
    reports: list[FaultReport] = []
    faults = FaultInjector([fault], rank=0, generation=3, report=reports.append, task="lm")
    answers: list[bool | None] = [None, True]
    faults.claim = lambda index: answers.pop(0)
    faults.rejoining()  # the store away: not struck, not given up
    assert reports == []
    faults.rejoining()  # it answers: this worker is first
    assert [r.action for r in reports] == ["stall_rejoin"] and answers == []

"""What a grow under way comes to at a tick, as a value (``generations.py:growth_verdict``), on
hand-built grows and task rows; the live test of newcomers joining is test_live_spares.py."""

from __future__ import annotations

from dataclasses import replace

from unicron.brain.membership import grown
from unicron.control.recover.generations import Growth, GrowthVerdict, growth_verdict
from unicron.core.states import TaskState

from .test_response import NOW, task, worker

TIMEOUT = 60.0


def growth() -> Growth:
    membership, newcomers = grown([worker(r, "a") for r in range(2)], 2, generation=6)
    return Growth(6, membership, newcomers, since=NOW)


def never() -> bool:
    raise AssertionError("readiness asked for when it cannot matter")


def test_a_grow_waits_for_its_newcomers_then_joins_or_is_given_up_at_the_launch_time_out() -> None:
    assert growth().newcomers == [2, 3]
    assert growth_verdict(growth(), task(), 100, lambda: False, NOW + 1.0, TIMEOUT) is GrowthVerdict.WAIT
    assert growth_verdict(growth(), task(), 100, lambda: True, NOW + 1.0, TIMEOUT) is GrowthVerdict.JOIN
    late = NOW + TIMEOUT + 1.0
    assert growth_verdict(growth(), task(), 100, lambda: False, late, TIMEOUT) is GrowthVerdict.NOT_READY
    assert (
        growth_verdict(growth(), task(), 100, lambda: True, late, TIMEOUT) is GrowthVerdict.JOIN
    )  # ready wins


def test_a_grow_of_a_task_gone_or_done_training_is_not_waited_for() -> None:
    assert growth_verdict(growth(), None, 100, never, NOW, TIMEOUT) is GrowthVerdict.FORGET
    stopping = replace(task(), state=TaskState.RESTARTING)
    assert growth_verdict(growth(), stopping, 100, never, NOW, TIMEOUT) is GrowthVerdict.FORGET
    # The members save and exit after the last step: they will not let anyone in.
    assert growth_verdict(growth(), task(), 40, never, NOW, TIMEOUT) is GrowthVerdict.TRAINING_ENDED
    assert GrowthVerdict.TRAINING_ENDED.value == "training ended"  # (the event's why, as before)

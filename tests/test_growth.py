"""Grows and planned shrinks as values, on hand-built grows and task rows: what a grow the plan
decides does (``membership.grow``), what a planned shrink does (``planned_shrink_effects``), and
what a grow under way comes to at a tick (``generations.py:growth_verdict``). The live test of
newcomers joining is test_live_spares.py."""

from __future__ import annotations

from dataclasses import replace

from unicron.brain.effects import EndWorkers, Launch, Record, Resized, StopWorker, Switch, UseSpare
from unicron.brain.membership import (
    Growth,
    given_up,
    grow,
    grown,
    joined,
    planned_shrink,
    planned_shrink_effects,
)
from unicron.control.recover.generations import GrowthVerdict, growth_verdict
from unicron.core.states import TaskState, WorkerPhase

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


def test_a_grow_renames_its_spares_first_and_starts_processes_for_the_rest() -> None:
    """lm (ranks 0-3 on a and b) grows by 3 onto c; a hot spare waits on c: it becomes rank 4,
    and two new processes (ranks 5, 6) start there."""
    live = [worker(r, "a" if r < 2 else "b") for r in range(4)]
    programs: list[int] = []

    def launch(world: int) -> tuple[list[str], dict[str, str]]:
        programs.append(world)
        return ["python", "train.py"], {"WORLD": str(world)}

    decided = grow(task(), live, 6, {"c": 3}, [(1000, "c", 1)], launch, "the plan", NOW)
    spare, started, record = decided.effects
    assert spare == UseSpare("lm", 1000, "c", 1, 6, 4, 7)
    assert started == Launch("lm", 6, 7, {"c": 2}, 5, ["python", "train.py"], {"WORLD": "7"}, joining=True)
    assert isinstance(record, Record) and record.kind == "task_grow"
    assert record.detail["spares_used"] == [1000] and record.detail["new_processes"] == {"c": 2}
    assert decided.spares_used == (1000,) and programs == [7]
    assert decided.growth == Growth(6, decided.growth.membership, [4, 5, 6], NOW)
    assert decided.growth.membership.ranks == {0: 0, 1: 1, 2: 2, 3: 3}


def test_a_planned_shrink_switches_the_kept_members_and_says_who_leaves() -> None:
    live = [worker(r, "a" if r < 2 else "b") for r in range(4)]
    shrink = planned_shrink(live, {"b": 2}, lambda n: n > 0, 6)
    assert shrink is not None
    switch, record = planned_shrink_effects(task(), 4, shrink, "node a drained")
    assert isinstance(switch, Switch) and [w.rank for w in switch.kept] == [2, 3]
    assert switch.renamed() == [(live[2], 0), (live[3], 1)] and switch.old == 3
    assert isinstance(record, Record) and record.detail == {
        "generation": 6,
        "before": 4,
        "workers": 2,
        "leaving": [0, 1],
        "reason": "node a drained",
    }


def test_a_grow_joins_its_members_and_newcomers_or_stops_exactly_its_newcomers() -> None:
    """Joined: the members (generation 3, ranks 0-1) switch into the grow's generation with its
    membership, the task counts 4 workers, the wait is said. Given up: each newcomer (generation
    6) is stopped by itself and its rows end; no member is touched."""
    members = [worker(r, "a") for r in range(2)]
    switch, resized, said = joined(task(), growth(), members, NOW + 2.5)
    assert isinstance(switch, Switch) and switch.kept == tuple(members) and switch.membership.generation == 6
    assert switch.renamed() == [(members[0], 0), (members[1], 1)]
    assert resized == Resized("lm", 6, 4)
    assert isinstance(said, Record) and said.kind == "task_grown" and said.detail["waited_s"] == 2.5
    newcomers = [worker(r, "b", generation=6) for r in (2, 3)]
    *stops, ended, why = given_up("lm", growth(), newcomers, "task_grow_failed", "not ready in time")
    assert stops == [StopWorker(w, 0.0) for w in newcomers]
    assert ended == EndWorkers("lm", 6, WorkerPhase.STOPPED)
    assert why == Record("task_grow_failed", "lm", None, {"generation": 6, "why": "not ready in time"})

"""The DP solver against exhaustive search, on random small instances (hypothesis); also with a
base's sweeps reused for problems that differ from it in a few tasks."""

from __future__ import annotations

import itertools
from unittest import mock

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from unicron.planning import solver
from unicron.planning.solver import Sweeps, TaskOptions, solve, solve_around


@st.composite
def instances(draw: st.DrawFn) -> tuple[list[TaskOptions], int]:
    capacity = draw(st.integers(0, 12))
    tasks = []
    for _ in range(draw(st.integers(1, 4))):
        units = [0, *draw(st.lists(st.integers(1, 14), max_size=5, unique=True))]
        # Small integer scores make exact ties common, which exercises the tie-breaking.
        score = [draw(st.integers(-3, 6)) for _ in units]
        changed = [draw(st.booleans()) for _ in units]
        tasks.append(TaskOptions(np.array(units), np.array(score, dtype=float), np.array(changed)))
    return tasks, capacity


def exhaustive(tasks: list[TaskOptions], capacity: int) -> tuple[float, int]:
    best: tuple[float, int] | None = None
    for picks in itertools.product(*(range(len(t.units)) for t in tasks)):
        if sum(int(t.units[p]) for t, p in zip(tasks, picks, strict=True)) > capacity:
            continue
        score = sum(float(t.score[p]) for t, p in zip(tasks, picks, strict=True))
        changes = sum(bool(t.changed[p]) for t, p in zip(tasks, picks, strict=True))
        if best is None or (score, -changes) > (best[0], -best[1]):
            best = (score, changes)
    assert best is not None  # all-zero always fits
    return best


@settings(max_examples=300, deadline=None)
@given(instances())
def test_dp_equals_exhaustive_search(instance: tuple[list[TaskOptions], int]) -> None:
    tasks, capacity = instance
    solution = solve(tasks, capacity)
    assert (solution.score, solution.changes) == exhaustive(tasks, capacity)
    # The reported plan is feasible and really has the reported score.
    assert sum(solution.units) <= capacity
    assert solution.score == sum(float(t.score[p]) for t, p in zip(tasks, solution.picks, strict=True))
    assert solution.units == tuple(int(t.units[p]) for t, p in zip(tasks, solution.picks, strict=True))


@settings(max_examples=300, deadline=None)
@given(instances())
def test_both_ways_of_building_a_steps_candidates_pick_alike(instance: tuple[list[TaskOptions], int]) -> None:
    """A wide programme shifts rows, a narrow one gathers cells (``solver._candidates``): the
    instances here are narrow, so the rows' way is forced on them too, and must pick the same."""
    tasks, capacity = instance
    gathered = solve(tasks, capacity)
    with mock.patch.object(solver, "SLICED_FROM", 0):
        assert solve(tasks, capacity) == gathered


def test_ties_keep_the_first_listed_option() -> None:
    same = TaskOptions(np.array([2, 0, 4]), np.array([5.0, 0.0, 5.0]), np.array([False, True, True]))
    assert solve([same], 10).units == (2,)


@settings(max_examples=300, deadline=None)
@given(instances(), instances(), st.data())
def test_a_base_with_tasks_replaced_removed_or_appended_equals_exhaustive_search(
    base: tuple[list[TaskOptions], int], others: tuple[list[TaskOptions], int], data: st.DataObject
) -> None:
    """``solve_around`` (the plan table's reuse of one base's sweeps across events) finds the
    best of the event's own problem, from whichever side the reused sweeps come."""
    tasks, capacity = base
    sweeps = Sweeps(tasks, capacity)
    for _ in range(3):  # one base's sweeps serve several events
        indices = data.draw(st.sets(st.integers(0, len(tasks) - 1), max_size=len(tasks)))
        replaced = {i: data.draw(st.sampled_from([None, *others[0]])) for i in indices}
        appended = data.draw(st.lists(st.sampled_from(others[0]), max_size=2))
        event = [replaced.get(i, t) for i, t in enumerate(tasks)]
        event_tasks = [t for t in event if t is not None] + appended
        solution = solve_around(sweeps, replaced, appended)
        assert (solution.score, solution.changes) == exhaustive(event_tasks, capacity)
        assert sum(solution.units) <= capacity
        picked = zip(event_tasks, solution.picks, strict=True)
        assert solution.units == tuple(int(t.units[p]) for t, p in picked)

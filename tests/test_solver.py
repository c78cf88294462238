"""The DP solver against exhaustive search, on random small instances (hypothesis)."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from unicron.planning.solver import TaskOptions, solve


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


def test_ties_keep_the_first_listed_option() -> None:
    same = TaskOptions(np.array([2, 0, 4]), np.array([5.0, 0.0, 5.0]), np.array([False, True, True]))
    assert solve([same], 10).units == (2,)

"""Exact plan search: dynamic programming over tasks and worker units.

S(i, j) = best score of the first i tasks using at most j units
        = max over options k of task i of S(i-1, j - k) + G_i(k).

Ties on score (within a relative tolerance, since different summation orders differ in the last
bits) go to the plan that changes fewer tasks, and then to the option listed first: callers list
each task's current count first, so a tie keeps things as they are. The plan is recovered by
backtracking through the recorded choices. Each task costs O(capacity x options) vector work.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from unicron.planning.throughput import FloatArray, IntArray

RELATIVE_TOLERANCE = 1e-9
T = TypeVar("T", bound="np.generic[Any]")
SLICED_FROM = 512  # units: from this programme width on, a step shifts rows (``_candidates``)


@dataclass(frozen=True)
class TaskOptions:
    """The counts (in units) one task may take, each with its score and whether it is a change."""

    units: IntArray
    score: FloatArray
    changed: npt.NDArray[np.bool_]

    def __post_init__(self) -> None:
        if not (len(self.units) == len(self.score) == len(self.changed)) or len(self.units) == 0:
            raise ValueError("units, score and changed must be non-empty and of equal length")
        if (self.units < 0).any():
            raise ValueError("unit counts must be non-negative")


@dataclass(frozen=True)
class Solution:
    picks: tuple[int, ...]  # index into each task's options
    units: tuple[int, ...]
    score: float
    changes: int


def _step(
    score: FloatArray, changes: IntArray, task: TaskOptions, capacity: int
) -> tuple[FloatArray, IntArray, IntArray]:
    """One task added to the best scores (and changes) of others using at most j units, j =
    0..capacity: the new arrays and, per j, the task's option chosen. One row per option, each
    the others' arrays shifted by the option's units (slices, not a gather per cell: a plan
    table's build and a solve on the spot are a hundred of these at 2,048 units)."""
    fits = np.flatnonzero(task.units <= capacity)
    if len(fits) == 0:
        raise ValueError("every task needs an option that fits, e.g. 0 units")
    # The others' best is the same for every j from ``flat`` on (they cannot use more units);
    # so is this task's best from ``flat`` + its largest option on: computed up to there, then
    # that column repeated (a forward sweep's first tasks use a small part of a large cluster).
    differs = np.flatnonzero((score != score[-1]) | (changes != changes[-1]))
    flat = int(differs[-1]) + 1 if len(differs) else 0
    width = min(capacity, flat + int(task.units[fits].max())) + 1
    score, changes = score[:width], changes[:width]
    cand_score, cand_changes = _candidates(score, changes, task, fits, width)
    # Lexicographic best per j: highest score (within tolerance), then fewest changes, then
    # the option listed first.
    top = cand_score.max(axis=0)
    tolerance = RELATIVE_TOLERANCE * np.maximum(np.abs(top), 1.0)
    near = cand_score >= top - tolerance
    fewest = np.where(near, cand_changes, np.iinfo(np.int64).max).min(axis=0)
    pick = np.argmax(near & (cand_changes == fewest), axis=0)
    best, rest = cand_score[pick, np.arange(width)], capacity + 1 - width
    return _padded(best, rest), _padded(fewest, rest), _padded(fits[pick], rest)


def _candidates(
    score: FloatArray, changes: IntArray, task: TaskOptions, fits: IntArray, width: int
) -> tuple[FloatArray, IntArray]:
    """Per option (a row) and j units (a column): the others' best with j less the option's
    units, plus the option's score and change (-inf where the option does not fit j). Wide
    programmes shift whole rows (slices: a plan at 2,048 units); narrow ones with many options
    gather every cell at once (a row's slicing costs more there than its cells)."""
    if width >= SLICED_FROM:
        cand_score = np.full((len(fits), width), -np.inf)
        cand_changes = np.empty((len(fits), width), dtype=np.int64)
        for row, option in enumerate(fits):
            units, changed = int(task.units[option]), int(task.changed[option])
            cand_score[row, units:] = score[: width - units] + task.score[option]
            cand_changes[row, units:] = changes[: width - units] + changed
            cand_changes[row, :units] = changes[0] + changed  # (j too small: -inf, a best only if none fits)
        return cand_score, cand_changes
    source = np.arange(width)[None, :] - task.units[fits][:, None]
    valid = source >= 0
    source = np.maximum(source, 0)
    cand_score = np.where(valid, score[source] + task.score[fits][:, None], -np.inf)
    return cand_score, changes[source] + task.changed[fits][:, None].astype(np.int64)


def _padded(values: npt.NDArray[T], count: int) -> npt.NDArray[T]:
    """``values`` with its last one repeated ``count`` times more."""
    return np.concatenate([values, np.repeat(values[-1:], count)]) if count else values


def solve(tasks: Sequence[TaskOptions], capacity: int) -> Solution:
    """The best choice of one option per task with total units at most ``capacity``."""
    return solve_around(Sweeps(tasks, capacity))


class Sweeps:
    """The programme over a base list of tasks, swept both ways and kept, so that many problems
    that differ from the base in a few tasks are each solved by redoing only those
    (``solve_around``): ``forward[i]``, the best of tasks ``[:i]`` using at most j units;
    ``backward[i]``, of tasks ``[i:]``. Stages are computed when first needed (a single solve
    computes about one sweep's worth)."""

    def __init__(self, tasks: Sequence[TaskOptions], capacity: int) -> None:
        if capacity < 0:
            raise ValueError("capacity must be non-negative")
        self.tasks, self.capacity = tuple(tasks), capacity
        zero = (np.zeros(capacity + 1), np.zeros(capacity + 1, dtype=np.int64))
        self.forward: list[tuple[FloatArray, IntArray]] = [zero]
        self.forward_pick: list[IntArray] = []  # [i]: task i's option, given j units for tasks [:i+1]
        self.backward: dict[int, tuple[FloatArray, IntArray]] = {len(self.tasks): zero}
        self.backward_pick: dict[int, IntArray] = {}  # [i]: task i's option, given j for tasks [i:]

    def before(self, i: int) -> tuple[FloatArray, IntArray]:
        while len(self.forward) <= i:
            k = len(self.forward) - 1
            score, changes, pick = _step(*self.forward[k], self.tasks[k], self.capacity)
            self.forward.append((score, changes))
            self.forward_pick.append(pick)
        return self.forward[i]

    def after(self, i: int) -> tuple[FloatArray, IntArray]:
        k = min(self.backward)
        while k > i:
            score, changes, pick = _step(*self.backward[k], self.tasks[k - 1], self.capacity)
            k -= 1
            self.backward[k], self.backward_pick[k] = (score, changes), pick
        return self.backward[i]


def solve_around(
    base: Sweeps,
    replaced: Mapping[int, TaskOptions | None] | None = None,
    appended: Sequence[TaskOptions] = (),
) -> Solution:
    """The best choice for the base's tasks with some ``replaced`` (index -> its options, or
    None: the task is gone) and others ``appended``; the solution lists the tasks left, in
    order, then the appended ones. Only the tasks from the first replaced one to the last are
    solved afresh; those before and after come from the base's sweeps. Ties between splits of
    the capacity, as within the programme, go to fewer changes, then to the first."""
    replaced = replaced or {}
    n, capacity = len(base.tasks), base.capacity
    first = min(replaced, default=n) if not appended else min(min(replaced, default=n), n)
    last = n - 1 if appended else max(replaced, default=n - 1)
    middle = [(i, replaced.get(i, base.tasks[i])) for i in range(first, last + 1)]
    middle += [(n + k, task) for k, task in enumerate(appended)]
    score, changes = base.before(first)
    picks: list[tuple[int, TaskOptions, IntArray]] = []
    for index, task in middle:
        if task is not None:
            score, changes, pick = _step(score, changes, task, capacity)
            picks.append((index, task, pick))
    tail_score, tail_changes = base.after(last + 1)
    # With no tail, the programme's own row at full capacity (as a plain solve).
    split = capacity if last + 1 == n else _best_split(score, changes, tail_score[::-1], tail_changes[::-1])
    chosen: dict[int, int] = {}
    left = capacity - split  # the tail's units, taken from the front
    for i in range(last + 1, n):
        chosen[i] = int(base.backward_pick[i][left])
        left -= int(base.tasks[i].units[chosen[i]])
    left = split
    for index, task, pick in reversed(picks):
        chosen[index] = int(pick[left])
        left -= int(task.units[chosen[index]])
    for i in range(first - 1, -1, -1):
        chosen[i] = int(base.forward_pick[i][left])
        left -= int(base.tasks[i].units[chosen[i]])
    kept = [(i, replaced.get(i, t)) for i, t in enumerate(base.tasks)]
    every = [(i, t) for i, t in kept if t is not None] + [(n + k, t) for k, t in enumerate(appended)]
    units = [int(t.units[chosen[i]]) for i, t in every]
    total = score[split] + tail_score[capacity - split]
    return Solution(
        tuple(chosen[i] for i, _ in every),
        tuple(units),
        float(total),
        int(changes[split] + tail_changes[capacity - split]),
    )


def _best_split(score: FloatArray, changes: IntArray, tail_score: FloatArray, tail_changes: IntArray) -> int:
    """The j that gives the head j units and the tail the rest (the tail's arrays reversed:
    ``tail_score[j]`` is the tail's best with capacity - j), by the programme's own rule."""
    total = score + tail_score
    top = total.max()
    near = total >= top - RELATIVE_TOLERANCE * max(abs(top), 1.0)
    moves = np.where(near, changes + tail_changes, np.iinfo(np.int64).max)
    return int(np.argmax(near & (moves == moves.min())))

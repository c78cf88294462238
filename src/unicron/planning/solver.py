"""Exact plan search: dynamic programming over tasks and worker units.

S(i, j) = best score of the first i tasks using at most j units
        = max over options k of task i of S(i-1, j - k) + G_i(k).

Ties on score (within a relative tolerance, since different summation orders differ in the last
bits) go to the plan that changes fewer tasks, and then to the option listed first: callers list
each task's current count first, so a tie keeps things as they are. The plan is recovered by
backtracking through the recorded choices. Each task costs O(capacity x options) vector work.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from unicron.planning.throughput import FloatArray, IntArray

RELATIVE_TOLERANCE = 1e-9


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


def solve(tasks: Sequence[TaskOptions], capacity: int) -> Solution:
    """The best choice of one option per task with total units at most ``capacity``."""
    if capacity < 0:
        raise ValueError("capacity must be non-negative")
    width = capacity + 1
    rows = np.arange(width)
    score = np.zeros(width)
    changes = np.zeros(width, dtype=np.int64)
    choices: list[IntArray] = []
    for task in tasks:
        fits = np.flatnonzero(task.units <= capacity)
        if len(fits) == 0:
            raise ValueError("every task needs an option that fits, e.g. 0 units")
        units = task.units[fits]
        source = rows[:, None] - units[None, :]
        valid = source >= 0
        source = np.maximum(source, 0)
        cand_score = np.where(valid, score[source] + task.score[fits][None, :], -np.inf)
        cand_changes = changes[source] + task.changed[fits][None, :].astype(np.int64)
        # Lexicographic best per row: highest score (within tolerance), then fewest changes,
        # then the option listed first.
        top = cand_score.max(axis=1)
        tolerance = RELATIVE_TOLERANCE * np.maximum(np.abs(top), 1.0)
        near = cand_score >= (top - tolerance)[:, None]
        fewest = np.where(near, cand_changes, np.iinfo(np.int64).max).min(axis=1)
        pick = np.argmax(near & (cand_changes == fewest[:, None]), axis=1)
        score = cand_score[rows, pick]
        changes = fewest
        choices.append(fits[pick])
    picks: list[int] = []
    left = capacity
    for task, choice in zip(reversed(tasks), reversed(choices), strict=True):
        index = int(choice[left])
        picks.append(index)
        left -= int(task.units[index])
    picks.reverse()
    return Solution(
        tuple(picks),
        tuple(int(t.units[p]) for t, p in zip(tasks, picks, strict=True)),
        float(score[capacity]),
        int(changes[capacity]),
    )

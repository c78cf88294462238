"""The live tests' sample-ledger check (``assert_ledger_exact``) on hand-built ledgers: it lets
through only the one way a killed node leaves a step recorded twice, and nothing else."""

from __future__ import annotations

from typing import Any

import pytest

from unicron.train.data import DataStream, shard

from .test_live_cluster import assert_ledger_exact

STEPS = 4


def line(step: int, generation: int, rank: int, world: int) -> dict[str, Any]:
    """The ledger line of ``rank`` that trained its share of ``step`` in a world of ``world``."""
    ids = shard(DataStream(16, 2, 512, 0).batch(step), rank, world)
    return {"what": "samples", "step": step, "generation": generation, "rank": rank, "ids": ids}


def node_lost_at(step: int, wrote: list[int]) -> list[dict[str, Any]]:
    """Four ranks train until ``step``, in whose all-reduce ranks 0 and 2 are lost: of them,
    ``wrote`` had finished it and written their lines; the two survivors redo it whole, as
    generation 2, and train on."""
    rows = [line(s, 1, r, 4) for s in range(1, step) for r in range(4)]
    rows += [line(step, 1, r, 4) for r in wrote]
    return rows + [line(s, 2, r, 2) for s in range(step, STEPS + 1) for r in range(2)]


def test_a_lost_ranks_line_for_the_step_the_survivors_redid_is_let_through() -> None:
    assert_ledger_exact(node_lost_at(3, wrote=[2]), STEPS, frozen=frozenset({0, 2}))
    assert_ledger_exact(node_lost_at(3, wrote=[]), STEPS, frozen=frozenset({0, 2}))


def test_a_survivors_line_for_a_redone_step_is_a_repeat() -> None:
    with pytest.raises(AssertionError):
        assert_ledger_exact(node_lost_at(3, wrote=[2]), STEPS, frozen=frozenset({0}))


def test_lines_of_two_redone_steps_are_repeats() -> None:
    rows = [*node_lost_at(3, wrote=[2]), line(4, 1, 0, 4)]
    with pytest.raises(AssertionError):
        assert_ledger_exact(rows, STEPS, frozen=frozenset({0, 2}))


def test_a_step_redone_whole_after_a_lost_line_is_not_also_short_elsewhere() -> None:
    # The lost ranks' one wrong record is used up by the redone step: a missing share of another
    # step is a loss.
    rows = [r for r in node_lost_at(3, wrote=[2]) if not (r["step"] == 1 and r["rank"] == 0)]
    with pytest.raises(AssertionError):
        assert_ledger_exact(rows, STEPS, frozen=frozenset({0, 2}))


def adopted_at(step: int) -> list[dict[str, Any]]:
    """Four ranks train until ``step``, in whose all-reduce ranks 2 and 3 are lost: rank 0's
    all-reduce ends before rank 1's breaks, so rank 0 applied the step and wrote its line; in
    generation 2 rank 1 takes rank 0's state, the step done, and writes its own share of it
    (the trace of a CI run of test_live_vanished, whose final parameters were exact)."""
    rows = [line(s, 1, r, 4) for s in range(1, step) for r in range(4)]
    rows += [line(step, 1, 0, 4), line(step, 2, 1, 4)]
    return rows + [line(s, 2, r, 2) for s in range(step + 1, STEPS + 1) for r in range(2)]


def test_a_survivors_line_for_a_step_the_others_took_from_it_stands() -> None:
    assert_ledger_exact(adopted_at(3), STEPS, frozen=frozenset({2, 3}))
    with pytest.raises(AssertionError):  # the lost ranks' shares are all it may lack
        assert_ledger_exact(
            [r for r in adopted_at(3) if r["generation"] == 1 or r["step"] != 3],
            STEPS,
            frozen=frozenset({2, 3}),
        )
    with pytest.raises(AssertionError):  # and rank 1's line, written again, is a repeat
        assert_ledger_exact([*adopted_at(3), line(3, 2, 1, 4)], STEPS, frozen=frozenset({2, 3}))

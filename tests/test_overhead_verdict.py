"""The overhead benchmark's verdict on the 1.02 target, judged from a cell's runs (pure): the
bootstrap interval of its ratio of medians, and whether it lies under, over or across the target."""

from __future__ import annotations

from bench.overhead_verdict import TARGET, judged, ratio_interval

DDP = [0.100, 0.104, 0.098, 0.101, 0.103, 0.099, 0.102]


def test_a_cell_clearly_under_or_over_the_target_is_met_or_missed() -> None:
    assert judged([x * 0.99 for x in DDP], DDP)["verdict"] == "met"
    assert judged([x * 1.05 for x in DDP], DDP)["verdict"] == "missed"


def test_noise_that_straddles_the_target_or_too_few_runs_leave_it_unresolved() -> None:
    wobbly = [x * f for x, f in zip(DDP, (0.96, 1.07, 0.98, 1.06, 1.01, 0.97, 1.08), strict=True)]
    low, high = ratio_interval(wobbly, DDP)
    assert low < TARGET < high
    assert judged(wobbly, DDP)["verdict"] == "unresolved"
    assert judged([x * 0.9 for x in DDP[:4]], DDP[:4])["verdict"] == "unresolved"  # 4 pairs: too few


def test_the_runs_are_drawn_in_their_pairs() -> None:
    # The machine slowed down halfway for both sides: paired, the ratio stays 1.01 in every draw.
    drifting = [0.1, 0.1, 0.1, 0.2, 0.2, 0.2]
    low, high = ratio_interval([x * 1.01 for x in drifting], drifting)
    assert abs(low - 1.01) < 1e-9 and abs(high - 1.01) < 1e-9


def test_cells_are_chosen_by_model_or_by_model_and_workers() -> None:
    import pytest

    from bench.overhead_bench import MODELS, cells

    assert cells(["gpt-10m:2", "tinygpt"]) == [("tinygpt", 1), ("tinygpt", 2), ("tinygpt", 4), ("gpt-10m", 2)]
    assert len(cells([])) == sum(len(m.workers) for m in MODELS.values())
    with pytest.raises(SystemExit, match=r"gpt-10m:3.*gpt-10m:1\|2\|4"):
        cells(["gpt-10m:3"])


def test_the_page_says_each_rows_own_run_count_where_they_differ() -> None:
    from bench.overhead_docs import runs_text

    def row(workers: int, runs: int) -> dict[str, object]:
        return {"model": "gpt-10m", "workers": workers, "unicron_runs_s": [0.3] * runs}

    assert runs_text([row(1, 9), row(2, 9), row(4, 9)], "gpt-10m") == "9"
    assert runs_text([row(1, 9), row(2, 15), row(4, 15)], "gpt-10m") == "15 (9 at 1 worker)"
    assert runs_text([row(2, 4)], "tinygpt") == "no"

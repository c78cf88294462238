"""The overhead cells with both sides at once (bench/side_by_side.py): which steps count, the
cores each side gets, what the pages say of such cells, and one real pair of runs."""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path

import pytest

from bench.pinning import Pinning, plan_pair
from bench.side_by_side import overlapping, window, worker_ends

from .test_bench_pinning import cell


def test_only_the_steps_both_sides_ran_at_once_count() -> None:
    # Ours: two workers stepping every 1 s from t=10 to 30; theirs: one from t=5 to 25, every 0.5 s.
    ours = [[10.0 + i for i in range(21)], [10.2 + i for i in range(21)]]
    theirs = [[5.0 + 0.5 * i for i in range(41)]]
    mine, other = overlapping(ours, theirs)
    # The window: from our later worker's first step (10.2) to their last (25.0).
    assert mine == pytest.approx([1.0] * (14 + 14))  # 11..25 on the first worker, 10.2..24.2 on the second
    assert other == pytest.approx([0.5] * 29)  # 10.5..25.0
    with pytest.raises(RuntimeError, match="more iterations"):
        overlapping([[0.0, 1.0, 2.0]], [[1.5 + i for i in range(20)]])  # barely at the same time


def test_each_side_gets_cores_of_its_own_and_the_control_processes_the_rest() -> None:
    alone = [frozenset({c}) for c in range(16)]
    first, second = plan_pair(alone, 4) or (None, None)
    assert first == Pinning(tuple(range(8)), (12, 13, 14, 15))
    assert second == Pinning(tuple(range(8)), (8, 9, 10, 11))
    paired = [frozenset({2 * i, 2 * i + 1}) for i in range(8)]  # a worker's sibling stays idle
    assert plan_pair(paired, 2) == (
        Pinning(tuple(range(8)), (12, 14), (13, 15)),
        Pinning(tuple(range(8)), (8, 10), (9, 11)),
    )
    assert plan_pair(alone[:8], 4) is None  # 8 cores: none left for the control processes


def side_row(pinned: bool) -> dict[str, object]:
    """A measured row of a cell whose sides ran at once: 5 pairs, Unicron clearly faster."""
    pairs = {
        "first": {"control": [0], "workers": [2], "idle": []},
        "second": {"control": [0], "workers": [1], "idle": []},
    }
    return cell("gpt-10m", 2, False) | {"side_by_side": True, "pinned": pairs if pinned else None}


def test_the_pages_tell_cells_run_at_once_from_the_others(tmp_path: Path) -> None:
    from bench import gpu_docs
    from bench.overhead_docs import more_cores

    row = gpu_docs.cpu_row(side_row(True))
    assert row.endswith("met | 5 a side, spread 2%, both sides at once, pinned |")
    assert gpu_docs.cpu_row(side_row(False)).endswith("both sides at once, unpinned |")
    note = gpu_docs.cpu_note([side_row(True)])
    assert "gpt-10m at 2 (both sides at once) (met)" in note and "side_by_side.py" in note
    path = tmp_path / "overhead-cpu.json"
    measured = {"machine": {"cpus": 16}, "gpt-10m-2-side": {"ok": True, "value": [side_row(True)]}}
    path.write_text(json.dumps(measured))
    said = more_cores(path)
    assert "gpt-10m at 2 (both sides at once): met" in said and "by core number" not in said


def test_a_pair_runs_both_sides_at_once_through_the_real_stack(tmp_path: Path) -> None:
    """tinygpt at one worker: torchrun + DDP and a Unicron task at the same time (unpinned: this
    machine has too few cores for a pair), each side's step time from the steps both ran meanwhile."""
    from bench.overhead_bench import MODELS
    from bench.side_by_side import measure

    model = dataclasses.replace(MODELS["tinygpt"], runs=1, iterations=300, torchft=False)
    row = measure(tmp_path, "tinygpt", 1, model, pin=False)
    assert row["side_by_side"] and row["pinned"] is None
    ours, theirs = (worker_ends(tmp_path / "tinygpt-1-0-side" / s / "times") for s in ("unicron", "ddp"))
    assert max(ours[0][0], theirs[0][0]) < min(ours[0][-1], theirs[0][-1])  # they ran at once
    mine, other = overlapping(ours, theirs)
    # Each side's step time is the median of its steps within the shared window only.
    assert row["unicron_runs_s"] == [round(statistics.median(mine), 5)]
    assert row["ddp_runs_s"] == [round(statistics.median(other), 5)]
    # The census of the pair: each side's worker, its threads' time within the shared window.
    census = json.loads((tmp_path / "tinygpt-1-0-side" / "census.json").read_text())
    assert census["window"] == list(window(ours, theirs))
    sides = {name.split("/")[0]: seen for name, seen in census["workers"].items()}
    assert set(sides) == {"unicron", "ddp"}, census["workers"].keys()
    for seen in sides.values():  # training ran in the window: its busiest thread used a CPU
        assert seen["busiest"][-1][1] > seen["busiest"][0][1], seen


def test_every_runs_step_times_come_back_in_one_file(tmp_path: Path) -> None:
    """A device call brings back at most 8 files: the raw step times of every run, a pair's
    sides included, and each pair's census go into one JSON, added to by each cell."""
    from bench.gpu_bench import keep_step_times

    runs, kept = tmp_path / "runs", tmp_path / "step-times.json"
    for folder, ends in (("tinygpt-2-0-ddp", [1.0, 2.0]), ("gpt-10m-2-0-side/unicron", [3.0])):
        (runs / folder / "times").mkdir(parents=True)
        (runs / folder / "times" / "steps-7.json").write_text(json.dumps(ends))
    keep_step_times(runs, kept)
    (runs / "gpt-10m-2-1-side" / "ddp" / "times").mkdir(parents=True)
    (runs / "gpt-10m-2-1-side" / "ddp" / "times" / "steps-8.json").write_text("[4.0]")
    (runs / "gpt-10m-2-1-side" / "census.json").write_text('{"cores": [12]}')
    keep_step_times(runs, kept)
    assert json.loads(kept.read_text()) == {
        "tinygpt-2-0-ddp": {"steps-7.json": [1.0, 2.0]},
        "gpt-10m-2-0-side/unicron": {"steps-7.json": [3.0]},
        "gpt-10m-2-1-side/ddp": {"steps-8.json": [4.0]},
        "gpt-10m-2-1-side": {"census": {"cores": [12]}},
    }

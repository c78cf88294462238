"""The sweep of Unicron against the baselines over failure rate, cluster size and tasks
(``bench/sweep_bench.py``): its cells, and its section of docs/simulation.md as its JSON gives it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import sweep_bench
from bench.sections import markers
from unicron.sim import interruptions

ROOT = Path(__file__).resolve().parents[1]


def test_a_cell_lasts_for_about_its_failures_within_the_bounds() -> None:
    assert sweep_bench.Cell(10, 128, 1).days == pytest.approx(200 * 10 / (16 * 24), abs=1e-3)
    assert sweep_bench.Cell(10_000, 128, 1).days == sweep_bench.MAX_DAYS
    assert sweep_bench.Cell(10, 16384, 1).days == sweep_bench.MIN_DAYS
    tasks = sweep_bench.cell_scenario(sweep_bench.Cell(100, 16384, 8)).tasks
    assert [t.worker_step for t in tasks] == [128] * 8  # 1/128 of the cluster
    assert len({(t.name, t.weight) for t in tasks}) == 8
    assert all(t.model is not None and t.model.global_batch == 16384 for t in tasks)
    (cell,) = sweep_bench.published_cells((1024,), (2,))
    assert cell.mtbf_hours == pytest.approx(interruptions.node_mtbf_hours(128, 8), abs=0.05)


def test_a_cells_leads_are_its_policies_shares_of_the_oracle() -> None:
    row = sweep_bench.run_cell(sweep_bench.Cell(20, 128, 2))
    assert row["failures"] > 50
    share = row["of_oracle"]
    assert 0 < share["megatron"] < share["unicron"] <= 1.0
    for baseline in sweep_bench.BASELINES:
        assert row["unicron_over"][baseline] == pytest.approx(share["unicron"] / share[baseline])


def test_the_pages_section_is_what_the_committed_figures_give() -> None:
    """docs/simulation.md's sweep is ``section`` of docs/bench/sweep.json (a hand edit is lost at
    the next `make bench`)."""
    figures = json.loads((ROOT / "docs" / "bench" / "sweep.json").read_text())
    start, end = markers("sweep_bench")
    page = (ROOT / "docs" / "simulation.md").read_text()
    assert page[page.index(start) + len(start) + 1 : page.index(end)] == sweep_bench.section(figures)

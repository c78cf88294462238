"""The pages the benchmarks write are what their templates and the committed figures give: a
page edited by hand, and not in its template, loses the edit at the next `make bench` (four
passages of docs/detection.md and docs/multi-host.md, and five metrics of
docs/observability.md, once were). Each benchmark's ``--docs`` mode writes its page again from
its last figures (``docs/bench/*.json``), here into a copy of ``bench/``, ``docs/`` and ``harness/``.

Checked: the seven pages a benchmark writes alone from its own JSON. Not here: performance.md
(two benchmarks write it in turn: the overhead's page, then the decisions' section), gpu.md
(written from a device run's output folder), and live-cluster.md, reference.md, reliability.md
and simulation.md (written from a demo, a chaos soak or a simulation run, not from a JSON kept
under docs/bench)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = {
    "detection_bench": "detection.md",
    "network_bench": "multi-host.md",
    "observe_bench": "observability.md",
    "checkpoint_bench": "checkpointing.md",
    "recovery_bench": "recovery.md",
    "scale_bench": "scale.md",
    "numerical_bench": "numerical-faults.md",
}


@pytest.mark.parametrize("bench", sorted(PAGES))
def test_a_page_written_by_a_benchmark_is_its_template_with_the_committed_figures(
    bench: str, tmp_path: Path
) -> None:
    for folder in ("bench", "docs", "harness"):
        shutil.copytree(
            ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__", "*.png")
        )
    done = subprocess.run(
        [sys.executable, "-m", f"bench.{bench}", "--docs"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    page = PAGES[bench]
    written, committed = (tmp_path / "docs" / page).read_text(), (ROOT / "docs" / page).read_text()
    assert written == committed, (
        f"docs/{page} differs from what bench/templates/{page} gives: edit the template, then"
        f" `python -m bench.{bench} --docs`"
    )

"""Both sides of an overhead cell at the same time, on disjoint cores (issue 12's verdict).

On a lent machine's 16 cores the speed drifts by ~7% over tens of seconds, within one run as
much as between runs: two Unicron runs of gpt-10m at 2 workers, back to back, took 0.402 s and
0.428 s a step, and one run's first half 0.387 s, its second 0.414 s (the session note of
2026-11-27). Runs taken one after the other (``overhead_bench.measure``) carry that drift into
the ratio, and 5 pairs left every cell's interval straddling the target.

Here the two runs of a pair are taken at once: torchrun + DDP's workers on one set of physical
cores, Unicron's on another, the launchers, coordinators and agents of both on the rest
(``pinning.plan_pair``). The core sets are swapped from pair to pair, so that a core's own speed
falls on both sides. Each side's step time counts only the steps that ended while both sides
were past their warm-up (``overlapping``): a drift meanwhile falls on both. What the two share
(memory bandwidth, caches, the control cores) they share alike. The pairs are judged as the
alternating ones are (``overhead_verdict``). A ``census`` of the workers' cores meanwhile
(``bench/census.py``) is kept beside each pair's runs: whether a slow run's threads waited for
their core, and what else ran there.
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.census import Census, summary, workers_under
from bench.overhead_bench import MODELS, WARMUP, Model, ddp, timed_row, unicron
from bench.pinning import on_cores, plan_pair, threads

MIN_OVERLAP = 10  # steps of each side in the shared window, fewer: the cell needs more iterations


def worker_ends(folder: Path) -> list[list[float]]:
    """Each worker's step-end times after the warm-up (``bench/steptimes.py``'s records)."""
    ends = [json.loads(p.read_text())[WARMUP:] for p in sorted(folder.glob("steps-*.json"))]
    if not any(ends):
        raise RuntimeError(f"no step times were recorded in {folder}")
    return ends


def window(ours: list[list[float]], theirs: list[list[float]]) -> tuple[float, float]:
    """When both sides were past their warm-up: from the later side's start (its last worker's
    first counted step) to the earlier side's end (its first worker's last step). The clocks are
    one: the step ends are ``time.perf_counter``, the machine's monotonic clock, in every process."""
    start = max(max(e[0] for e in side) for side in (ours, theirs))
    return start, min(min(e[-1] for e in side) for side in (ours, theirs))


def overlapping(ours: list[list[float]], theirs: list[list[float]]) -> tuple[list[float], list[float]]:
    """Each side's step intervals (pooled over its workers) that lie within the ``window``."""
    start, end = window(ours, theirs)

    def within(side: list[list[float]]) -> list[float]:
        return [b - a for e in side for a, b in itertools.pairwise(e) if start <= a and b <= end]

    both = within(ours), within(theirs)
    if min(len(x) for x in both) < MIN_OVERLAP:
        raise RuntimeError(
            f"the two sides ran at the same time for too few steps ({[len(x) for x in both]} "
            f"intervals, at least {MIN_OVERLAP} each): give the cell more iterations"
        )
    return both


def measure(root: Path, model: str, workers: int, m: Model | None = None, pin: bool = True) -> dict[str, Any]:
    """One cell, its pairs run side by side (``m``: a model other than ``MODELS``'s, under that
    name); ``pin``: on disjoint physical cores where the machine has ``2 * workers + 1``, else
    (or without ``pin``) free to move."""
    m = m or MODELS[model]
    pair = plan_pair(threads(os.sched_getaffinity(0)), workers) if pin else None
    runs: dict[str, list[float]] = {"unicron": [], "ddp": []}
    with on_cores(pair[0].control if pair else None), ThreadPoolExecutor(2) as pool:
        for i in range(m.runs):
            ours, theirs = (pair if i % 2 == 0 else pair[::-1]) if pair else (None, None)
            where = root / f"{model}-{workers}-{i}-side"
            mine, other = run_pair(
                pool, where, m, workers, (ours.workers, theirs.workers) if ours and theirs else None
            )
            runs["unicron"].append(mine)
            runs["ddp"].append(other)
    return {
        **timed_row(model, workers, m, runs),
        "side_by_side": True,
        "pinned": {"first": pair[0].as_json(), "second": pair[1].as_json()} if pair else None,
    }


def run_pair(
    pool: ThreadPoolExecutor, where: Path, m: Model, workers: int, cores: tuple[tuple[int, ...], ...] | None
) -> tuple[float, float]:
    """One pair at once, in ``where``: Unicron's and torchrun's median step within the window
    both ran (``cores``: each side's workers' cores, else unpinned); the census of the workers'
    cores meanwhile is written beside them (``census.json``) and printed in short."""
    ours, theirs = cores or ((), ())
    with Census(workers_under(where), (*ours, *theirs)) as census:
        started = [
            pool.submit(unicron, where / "unicron", m, workers, cores=ours),
            pool.submit(ddp, where / "ddp", m, workers, cores=theirs),
        ]
        for run in started:
            run.result()
    ends = [worker_ends(where / side / "times") for side in ("unicron", "ddp")]
    seen = census.result(window(*ends))
    (where / "census.json").write_text(json.dumps(seen))
    mine, other = (statistics.median(intervals) for intervals in overlapping(*ends))
    print(f"{where.name}: unicron {mine:.5f} s, ddp {other:.5f} s a step\n{summary(seen)}", flush=True)
    return mine, other

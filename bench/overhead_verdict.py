"""The overhead benchmark's verdict on the 1.02 target (issues 12 and 14): each cell judged by a
bootstrap interval of its ratio of medians, the runs drawn in their alternating pairs. Pure: a
function of the runs in docs/bench/overhead.json, so the page can be judged again without
measuring (``python -m bench.overhead_bench --docs``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

TARGET = 1.02  # issues 12 and 14: Unicron / torchrun step time at most this
CONFIDENCE = 0.95  # of the interval a cell's ratio is judged by
DRAWS = 20_000  # bootstrap resamples per cell (seeded: the interval is a function of the runs)
# Fewer pairs than this leave a bootstrap too few distinct resamples to judge by (2 pairs: 3).
MIN_PAIRS = 5


def ratio_interval(ours: Sequence[float], theirs: Sequence[float]) -> tuple[float, float]:
    """A ``CONFIDENCE`` bootstrap interval of the ratio of the two sides' median step times.
    Run i of each side ran next to the other's (the alternating order), so the runs are drawn
    in pairs: a stretch when the machine was slow for both stays in both."""
    pairs = np.array(list(zip(ours, theirs, strict=True)))
    drawn = pairs[np.random.default_rng(0).integers(0, len(pairs), (DRAWS, len(pairs)))]
    ratios = np.median(drawn[:, :, 0], axis=1) / np.median(drawn[:, :, 1], axis=1)
    tail = (1 - CONFIDENCE) / 2
    low, high = np.quantile(ratios, [tail, 1 - tail])
    return float(low), float(high)


def judged(ours: Sequence[float], theirs: Sequence[float], target: float = TARGET) -> dict[str, Any]:
    """A cell's verdict on ``target`` from its interval: met (the interval lies at or under
    it), missed (over it) or unresolved (it straddles the target, or the cell has fewer than
    ``MIN_PAIRS`` runs a side: more runs, or less noise)."""
    low, high = ratio_interval(ours, theirs)
    verdict = "met" if high <= target else "missed" if low > target else "unresolved"
    if len(ours) < MIN_PAIRS:
        verdict = "unresolved"
    return {"ratio_interval": [round(low, 4), round(high, 4)], "verdict": verdict}


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """``result`` with every row judged from its runs, and the verdict over all rows: met only
    where every cell's interval lies at or under the target."""
    rows = [r | judged(r["unicron_runs_s"], r["ddp_runs_s"]) for r in result["rows"]]
    cells = {
        v: [f"{r['model']} at {r['workers']}" for r in rows if r["verdict"] == v]
        for v in ("missed", "unresolved")
    }
    return result | {
        "rows": rows,
        "confidence": CONFIDENCE,
        "met": all(r["verdict"] == "met" for r in rows),
        **cells,
    }


def spread(row: dict[str, Any]) -> float:
    """The cell's noise: how far apart the runs of one side are, the largest side's (max/min - 1)."""
    sides = [row[k] for k in ("unicron_runs_s", "ddp_runs_s", "torchft_runs_s") if k in row]
    return max(max(t) / min(t) - 1 for t in sides)

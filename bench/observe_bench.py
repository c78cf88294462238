"""What watching costs training: the same Unicron task with and without a Prometheus scrape of
``/metrics`` and a dashboard poll of ``/v1/dashboard`` every second (``bench/scraper.py``).

The overhead benchmark's tinygpt port at 2 workers (``overhead_bench``: same program, same step
timer), in one run, alternating quiet and watched (quiet, watched, watched, quiet, ...) so that the
machine's drift falls on both; the median run of each side. The scraper runs on this machine, so
its own CPU is counted against the watched side (a real scraper runs elsewhere): the figure is an
upper bound. Also each answer's time (median, p99).

Writes docs/bench/observability.json and the measured section of docs/observability.md
(``python -m bench.observe_bench``; run by `make bench`; ``--docs`` rewrites the page from the
last JSON).
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench import overhead_bench
from bench.scraper import PATHS, Scraper

ROOT = Path(__file__).resolve().parents[1]
MODEL, WORKERS, RUNS = "tinygpt", 2, 4  # runs a side
ITERATIONS = 1500  # ~25 s of steps a run: each run sees tens of scrapes
PERIOD_S = 1.0  # Prometheus' default scrape interval is 15 s; the page polls each second


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> dict[str, Any]:
    runs: dict[str, list[float]] = {"quiet": [], "watched": []}
    scraped: list[Scraper] = []
    order = [side for i in range(RUNS) for side in (("quiet", "watched"), ("watched", "quiet"))[i % 2]]
    with tempfile.TemporaryDirectory(prefix="unicron-observe-") as tmp:
        for i, side in enumerate(order):
            where = Path(tmp) / f"{i}-{side}"
            watch = scraped if side == "watched" else None
            runs[side].append(overhead_bench.unicron(where, MODEL, WORKERS, watch, ITERATIONS))
    quiet, watched = statistics.median(runs["quiet"]), statistics.median(runs["watched"])
    answers = {path: [s for scraper in scraped for s in scraper.seconds[path]] for path in PATHS}
    result = {
        "model": MODEL,
        "workers": WORKERS,
        "iterations": ITERATIONS,
        "period_s": PERIOD_S,
        "quiet_step_s": round(quiet, 5),
        "watched_step_s": round(watched, 5),
        "ratio": round(watched / quiet, 4),
        "quiet_runs_s": [round(x, 5) for x in runs["quiet"]],
        "watched_runs_s": [round(x, 5) for x in runs["watched"]],
        "answers": {
            path: {
                "count": len(times),
                "median_ms": round(statistics.median(times) * 1000, 2),
                "p99_ms": round(quantile(times, 0.99) * 1000, 2),
            }
            for path, times in answers.items()
            if times
        },
        "failed_answers": sum(s.failures for s in scraped),
    }
    (ROOT / "docs" / "bench" / "observability.json").write_text(json.dumps(result, indent=2) + "\n")
    write_markdown(result)
    return result


def spread(runs: list[float]) -> float:
    return max(runs) / min(runs) - 1


def write_markdown(r: dict[str, Any]) -> None:
    """The measured section of docs/observability.md (the rest of the page is the template's)."""
    answers = "\n".join(
        f"| `{path}` | {a['count']} | {a['median_ms']:.1f} ms | {a['p99_ms']:.1f} ms |"
        for path, a in r["answers"].items()
    )
    noise = max(spread(r["quiet_runs_s"]), spread(r["watched_runs_s"]))
    cost = r["ratio"] - 1
    verdict = (
        f"The difference, {cost * 100:+.1f}%, is within that: no cost this machine can measure."
        if abs(cost) <= noise
        else f"The difference, {cost * 100:+.1f}%, is outside that: watching costs this much here."
    )
    template = (Path(__file__).parent / "templates" / "observability.md").read_text()
    (ROOT / "docs" / "observability.md").write_text(
        template.format(
            model=r["model"],
            workers=r["workers"],
            iterations=r["iterations"],
            period=r["period_s"],
            runs=len(r["quiet_runs_s"]),
            quiet=r["quiet_step_s"] * 1000,
            watched=r["watched_step_s"] * 1000,
            ratio=r["ratio"],
            noise=noise * 100,
            verdict=verdict,
            answers=answers,
            failed=r["failed_answers"],
        )
    )


if __name__ == "__main__":
    if sys.argv[1:] == ["--docs"]:  # the page again from the last measured figures (a text change)
        write_markdown(json.loads((ROOT / "docs" / "bench" / "observability.json").read_text()))
    else:
        print(json.dumps(main(), indent=2))

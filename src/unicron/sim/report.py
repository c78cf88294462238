"""Reports of a simulation: a summary table, JSON, and PNG plots."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from unicron.core.extras import require
from unicron.sim.engine import CAUSES, HOUR
from unicron.sim.runner import SimulationReport

EXA = 1e18
PETA = 1e15

# The summary table's columns (the command's and docs/simulation.md's): plain words, their unit.
COLUMNS = ("policy", "mean WAF (PFLOP/s)", "% of oracle", "Unicron ahead by")
CAUSE_COLUMNS = {  # the oracle's WAF lost to each cause, in % (engine.py)
    "detection": "detection",
    "restart": "restart",
    "lost_work": "redone work",
    "repair_wait": "repair wait",
    "overhead": "slower steps",
    "sub_healthy": "worse allocation",
}
LEGEND = (
    "WAF: weighted achieved FLOP/s, the run's mean. Unicron ahead by: Unicron's WAF over the "
    "policy's. The last six columns: the share of the oracle's WAF lost to each cause, in %: "
    "detection, restart, redone work, waiting for a repair, slower steps (a lower throughput "
    "without failures), an allocation worse than the optimum for the healthy nodes."
)


def summary_rows(report: SimulationReport) -> list[dict[str, Any]]:
    rows = []
    seconds = report.scenario.days * 24 * HOUR
    unicron = next((r for r in report.results if r.policy == "unicron"), None)
    for r in report.results:
        lost = {c: r.lost_flop[c] / r.ideal_flop if r.ideal_flop else 0.0 for c in CAUSES}
        ahead = (
            unicron.waf_flop / r.waf_flop if unicron and unicron.did_not_run is None and r.waf_flop else None
        )
        rows.append(
            {
                "policy": r.policy,
                "waf_flop": r.waf_flop,
                "mean_waf_flops": r.waf_flop / seconds,
                "ratio_to_oracle": r.ratio_to_oracle,
                "unicron_over_this": ahead,
                "lost_share": lost,
                "did_not_run": r.did_not_run,
                "tasks_not_run": dict(r.cannot_run),
            }
        )
    return rows


def summary_cells(row: dict[str, Any]) -> list[str]:
    """A summary row's cells, in ``COLUMNS`` then ``CAUSE_COLUMNS`` order. A policy that did
    not run has no ratio and no losses to show (``summary_notes`` says why)."""
    if row["did_not_run"] is not None:
        return [row["policy"], "0", "did not run", "-", *["-"] * len(CAUSES)]
    ratio, ahead = row["ratio_to_oracle"], row["unicron_over_this"]
    return [
        row["policy"],
        f"{row['mean_waf_flops'] / PETA:,.1f}",
        "-" if ratio is None else f"{100 * ratio:.2f}%",
        "-" if ahead is None else f"{ahead:.2f}x",
        *(f"{100 * row['lost_share'][c]:.2f}%" for c in CAUSES),
    ]


def summary_notes(report: SimulationReport) -> list[str]:
    """Why a policy did not run, or ran without some of its tasks."""
    notes = []
    for row in summary_rows(report):
        if row["did_not_run"] is not None:
            notes.append(f"{row['policy']} did not run: {row['did_not_run']}")
        else:
            notes += [
                f"{row['policy']} ran without {task}: {why}" for task, why in row["tasks_not_run"].items()
            ]
    return notes


def to_json(report: SimulationReport) -> dict[str, Any]:
    return {
        "scenario": report.scenario.name,
        "days": report.scenario.days,
        "gpus": report.scenario.cluster.total_gpus,
        "failures": len(report.failures),
        "simulate_s": report.seconds,
        "policies": {
            r.policy: {
                "waf_flop": r.waf_flop,
                "ratio_to_oracle": r.ratio_to_oracle,  # null: it did not run (did_not_run says why)
                "did_not_run": r.did_not_run,
                "tasks_not_run": r.cannot_run,  # task -> why the policy cannot run it
                "ideal_flop": r.ideal_flop,
                "lost_flop": r.lost_flop,
                "task_flop": r.task_flop,
            }
            for r in report.results
        },
    }


def plot(report: SimulationReport, path: Path) -> None:
    """WAF over time per policy (left) and lost WAF by cause (right)."""
    matplotlib = require("matplotlib", "plot", "a plot")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.6), gridspec_kw={"width_ratios": [3, 2]})
    for r in report.results:
        style = {"linestyle": ":", "color": "black"} if r.policy == "oracle" else {}
        left.plot(r.timeline_hours, [w / 1e15 for w in r.timeline_waf], label=r.policy, linewidth=1, **style)
    for f in report.failures:
        left.axvline(f.time_hours, color="red", alpha=0.15, linewidth=0.6)
    left.set(
        xlabel="hours",
        ylabel="cluster WAF (weighted PFLOP/s)",
        title=f"{report.scenario.name}: WAF over time ({len(report.failures)} failures, red)",
    )
    left.legend(fontsize=8, loc="lower left")
    # (a policy that did not run has nothing to break down)
    names = [r.policy for r in report.results if r.policy != "oracle" and r.did_not_run is None]
    bottom = [0.0] * len(names)
    for cause in CAUSES:
        values = [
            100
            * next(r for r in report.results if r.policy == n).lost_flop[cause]
            / next(r for r in report.results if r.policy == n).ideal_flop
            for n in names
        ]
        right.bar(names, values, bottom=bottom, label=cause.replace("_", " "))
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    right.set(ylabel="% of the oracle's WAF lost", title="Lost WAF by cause")
    right.legend(fontsize=8)
    right.tick_params(axis="x", labelrotation=30)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

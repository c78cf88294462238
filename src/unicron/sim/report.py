"""Reports of a simulation: a summary table, JSON, and PNG plots."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from unicron.sim.engine import CAUSES
from unicron.sim.runner import SimulationReport

EXA = 1e18


def summary_rows(report: SimulationReport) -> list[dict[str, Any]]:
    rows = []
    unicron = next((r for r in report.results if r.policy == "unicron"), None)
    for r in report.results:
        lost = {c: r.lost_flop[c] / r.ideal_flop for c in CAUSES}
        rows.append(
            {
                "policy": r.policy,
                "waf_flop": r.waf_flop,
                "ratio_to_oracle": r.ratio_to_oracle,
                "unicron_over_this": (unicron.waf_flop / r.waf_flop) if unicron and r.waf_flop else None,
                "lost_share": lost,
            }
        )
    return rows


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
                "ratio_to_oracle": r.ratio_to_oracle,
                "ideal_flop": r.ideal_flop,
                "lost_flop": r.lost_flop,
                "task_flop": r.task_flop,
            }
            for r in report.results
        },
    }


def plot(report: SimulationReport, path: Path) -> None:
    """WAF over time per policy (left) and lost WAF by cause (right)."""
    import matplotlib

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
    names = [r.policy for r in report.results if r.policy != "oracle"]
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

"""``unicron simulate``: replay a trace against Unicron and the baselines."""

from __future__ import annotations

import json
from pathlib import Path

from rich.table import Table

from unicron.cli.console import console as make_console
from unicron.cli.files import read_text
from unicron.sim.engine import CAUSES
from unicron.sim.report import plot, summary_rows, to_json
from unicron.sim.runner import simulate
from unicron.sim.scenario import parse_scenario
from unicron.sim.traces import parse_trace, to_csv


def run_simulate(
    scenario_path: Path,
    *,
    trace: Path | None,
    json_output: bool,
    plot_path: Path | None,
    save_trace: Path | None,
) -> None:
    scenario = parse_scenario(read_text(scenario_path), str(scenario_path))
    failures = None
    if trace is not None:
        failures = parse_trace(read_text(trace), str(trace), nodes=scenario.cluster.nodes)
    report = simulate(scenario, failures)
    if save_trace is not None:
        save_trace.write_text(to_csv(report.failures))
    if plot_path is not None:
        plot(report, plot_path)
    if json_output:
        print(json.dumps(to_json(report), indent=2))
        return
    console = make_console()
    table = Table(
        title=f"{scenario.name}: {scenario.days:g} days, {scenario.cluster.total_gpus} GPUs, "
        f"{len(report.failures)} failures; lost WAF in % of the oracle's",
        title_justify="left",
    )
    for column in ("policy", "WAF (EFLOP)", "vs oracle", "Unicron/it", *SHORT.values()):
        table.add_column(column, justify="left" if column == "policy" else "right", no_wrap=True)
    for row in summary_rows(report):
        ratio = row["unicron_over_this"]
        table.add_row(
            row["policy"],
            f"{row['waf_flop'] / 1e18:,.0f}",
            f"{row['ratio_to_oracle']:.3f}",
            "-" if ratio is None else f"{ratio:.2f}x",
            *(f"{100 * row['lost_share'][c]:.2f}" for c in CAUSES),
        )
    console.print(table)
    console.print(f"simulated in {report.seconds:.2f} s" + (f"; plot: {plot_path}" if plot_path else ""))


SHORT = {
    "detection": "detect",
    "restart": "restart",
    "lost_work": "redo",
    "repair_wait": "wait",
    "overhead": "overhead",
    "sub_healthy": "sub-healthy",
}

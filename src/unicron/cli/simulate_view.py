"""``unicron simulate``: replay a trace against Unicron and the baselines."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from rich.table import Table

from unicron.cli.console import console as make_console
from unicron.cli.files import read_text
from unicron.core.errors import UsageError
from unicron.core.extras import require
from unicron.sim.public_traces import convert
from unicron.sim.report import (
    CAUSE_COLUMNS,
    COLUMNS,
    LEGEND,
    plot,
    summary_cells,
    summary_notes,
    summary_rows,
    to_json,
)
from unicron.sim.runner import simulate
from unicron.sim.scenario import ScenarioSpec, parse_scenario
from unicron.sim.traces import parse_trace, spanned_days, to_csv

PROGRESS_EVERY_S = 3.0  # a run shorter than this prints no progress


class ProgressLine:
    """Where a long simulation is, on stderr every ``every`` seconds: the policy (of how many)
    and the simulated day reached. Nothing for a run that ends before the first line is due."""

    def __init__(
        self,
        scenario: ScenarioSpec,
        every: float = PROGRESS_EVERY_S,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.scenario, self.every, self.stream, self.clock = scenario, every, stream, clock
        self.started = clock()
        self.due = self.started + every

    def __call__(self, policy: str, hours: float) -> None:
        now = self.clock()
        if now < self.due:
            return
        self.due = now + self.every
        s = self.scenario
        print(
            f"simulating {s.name}: {policy} ({s.policies.index(policy) + 1} of {len(s.policies)} "
            f"policies), day {hours / 24:.1f} of {s.days:g}, {now - self.started:.0f} s so far",
            file=self.stream or sys.stderr,
            flush=True,
        )


def run_simulate(
    scenario_path: Path,
    *,
    trace: Path | None,
    json_output: bool,
    plot_path: Path | None,
    save_trace: Path | None,
    span_trace: bool = False,
) -> None:
    if span_trace and trace is None:
        raise UsageError("--span-trace lengthens the scenario to a given trace: pass --trace FILE too")
    if plot_path is not None:
        require("matplotlib", "plot", "--plot")  # before the simulation, not after it
    scenario = parse_scenario(read_text(scenario_path), str(scenario_path))
    failures = None
    if trace is not None:
        # Every row is replayed or refused, never dropped: past the scenario's end, a row is an
        # error naming it, unless the scenario is told to span the trace.
        hours = None if span_trace else scenario.days * 24
        failures = parse_trace(read_text(trace), str(trace), nodes=scenario.cluster.nodes, hours=hours)
        if span_trace:
            scenario = scenario.model_copy(update={"days": spanned_days(failures, scenario.days)})
    report = simulate(scenario, failures, progress=ProgressLine(scenario))
    if save_trace is not None:
        save_trace.write_text(to_csv(report.failures))
    if plot_path is not None:
        plot(report, plot_path)
    if json_output:
        print(json.dumps(to_json(report), indent=2))
        return
    console = make_console()
    table = Table(
        title=f"{scenario.name}: {scenario.days:g} days, {scenario.cluster.total_gpus:,} GPUs, "
        f"{len(report.failures)} failures",
        caption=LEGEND,
        title_justify="left",
        caption_justify="left",
    )
    for column in (*COLUMNS, *CAUSE_COLUMNS.values()):
        table.add_column(column, justify="left" if column == "policy" else "right")
    for row in summary_rows(report):
        table.add_row(*summary_cells(row))
    console.print(table)
    for note in summary_notes(report):
        console.print(note, markup=False, highlight=False)
    console.print(f"simulated in {report.seconds:.2f} s" + (f"; plot: {plot_path}" if plot_path else ""))


def run_convert(source: Path, fmt: str, out: Path | None) -> None:
    """``unicron trace convert``: the dataset's faults as a trace, and a summary on stderr."""
    converted = convert(read_text(source), str(source), fmt)
    text = to_csv(converted.failures)
    if out is None:
        sys.stdout.write(text)
    else:
        out.write_text(text)
    notes = []
    if converted.open_at_end:
        notes.append(f"{converted.open_at_end} still open at its end, out until its last event")
    if converted.ends_without_start:
        notes.append(f"{converted.ends_without_start} ends without a start left out")
    print(
        f"{len(converted.failures)} faults of {converted.nodes} nodes over {converted.days:.1f} days"
        + (f" ({'; '.join(notes)})" if notes else "")
        + f". Replay it on a scenario of at least {converted.nodes} nodes: unicron simulate SCENARIO"
        f" --trace {out or 'TRACE.csv'} --span-trace",
        file=sys.stderr,
    )

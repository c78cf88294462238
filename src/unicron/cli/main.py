"""Entry point of the ``unicron`` command.

Subcommands import what they need inside their bodies so that ``unicron plan`` never pays for
torch or the service stack. Every :class:`UnicronError` is printed as a message with exit code 2.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from unicron.core.errors import UnicronError

app = typer.Typer(
    name="unicron",
    help="Self-healing workload manager for LLM training on shared GPU clusters.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.command()
def plan(
    cluster: Annotated[Path, typer.Argument(help="cluster YAML (nodes, GPUs, assignment)")],
    tasks: Annotated[Path, typer.Argument(help="tasks YAML (a list under 'tasks:')")],
    json_output: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    event: Annotated[
        str | None,
        typer.Option(help="show the precomputed answer to node-lost:N, node-back or task-done:NAME"),
    ] = None,
) -> None:
    """Print the plan that maximises weighted achieved FLOP/s (WAF) for the cluster."""
    from unicron.cli.plan_view import run_plan

    run_plan(cluster, tasks, json_output=json_output, event=event)


@app.command()
def simulate(
    scenario: Annotated[Path, typer.Argument(help="scenario YAML (cluster, tasks, days, trace)")],
    trace: Annotated[
        Path | None, typer.Option(help="failure trace (CSV or JSON) instead of a generated one")
    ] = None,
    json_output: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    plot: Annotated[Path | None, typer.Option(help="write WAF-over-time and lost-WAF plots (PNG)")] = None,
    save_trace: Annotated[Path | None, typer.Option(help="write the trace used, as CSV")] = None,
) -> None:
    """Replay a failure trace against Unicron and the baselines."""
    from unicron.cli.simulate_view import run_simulate

    run_simulate(scenario, trace=trace, json_output=json_output, plot_path=plot, save_trace=save_trace)


@app.callback()
def root() -> None:
    """Self-healing workload manager for LLM training on shared GPU clusters."""


def main(argv: list[str] | None = None) -> None:
    try:
        app(args=argv)
    except UnicronError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()

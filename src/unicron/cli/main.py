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


URL = Annotated[str, typer.Option("--coordinator", envvar="UNICRON_COORDINATOR", help="coordinator URL")]


@app.command()
def coordinator(
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on")] = 8470,
    state_dir: Annotated[Path, typer.Option(help="where the durable state lives")] = Path(
        ".unicron/coordinator"
    ),
    checkpoint_dir: Annotated[
        Path | None, typer.Option(help="checkpoint root, shared with the agents' machines")
    ] = None,
    advertise: Annotated[str | None, typer.Option(help="address workers use to reach the rendezvous")] = None,
    settings: Annotated[
        Path | None, typer.Option(help="YAML of detection and handling settings (docs/detection.md)")
    ] = None,
    cluster: Annotated[
        Path | None,
        typer.Option(
            help="YAML of the planner's hardware inputs: gpu, node_mtbf_hours (docs/live-cluster.md)"
        ),
    ] = None,
) -> None:
    """Run the coordinator service (REST API, agent channel, planner, rendezvous)."""
    from unicron.cli.live import run_coordinator

    run_coordinator(host, port, state_dir, checkpoint_dir, advertise, settings, cluster)


@app.command()
def agent(
    coordinator: URL = "http://127.0.0.1:8470",
    slots: Annotated[int, typer.Option(help="worker slots (GPUs) on this node")] = 1,
    node: Annotated[str | None, typer.Option(help="node name (default: the host name)")] = None,
    run_dir: Annotated[Path | None, typer.Option(help="for the socket and worker logs")] = None,
    gpus: Annotated[str | None, typer.Option(help="comma-separated GPU ids, one per slot")] = None,
) -> None:
    """Run a node agent: register, heartbeat, launch and supervise workers."""
    from unicron.cli.live import run_agent

    run_agent(coordinator, node, slots, run_dir, gpus)


@app.command()
def submit(
    spec: Annotated[Path, typer.Argument(help="task YAML: one task, or several under 'tasks:'")],
    coordinator: URL = "http://127.0.0.1:8470",
) -> None:
    """Submit tasks to the coordinator."""
    from unicron.cli.live import submit as send

    send(coordinator, spec)


@app.command()
def cancel(name: str, coordinator: URL = "http://127.0.0.1:8470") -> None:
    """Cancel a task: its workers stop and its slots are re-planned."""
    from unicron.cli.live import cancel as send

    send(coordinator, name)


@app.command()
def status(
    coordinator: URL = "http://127.0.0.1:8470",
    json_output: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Print nodes, slots, tasks and workers."""
    from unicron.cli.live import status as show

    show(coordinator, json_output)


@app.command()
def events(
    coordinator: URL = "http://127.0.0.1:8470",
    task: Annotated[str | None, typer.Option(help="only this task's events")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Print the coordinator's event log."""
    from unicron.cli.live import events as show

    show(coordinator, task, json_output)


@app.command()
def demo(
    root: Annotated[Path | None, typer.Option(help="where state and logs go (default: a new folder)")] = None,
) -> None:
    """Run the live demo on an embedded local cluster (what `make demo` runs)."""
    import time as _time

    from unicron.cli.demo import run_demo

    raise typer.Exit(run_demo(root or Path(f".unicron/demo-{_time.strftime('%Y%m%d-%H%M%S')}")))


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

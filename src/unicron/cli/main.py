"""Entry point of the ``unicron`` command.

Subcommands import what they need inside their bodies so that ``unicron plan`` never pays for
torch or the service stack. Every :class:`UnicronError` is printed as a message with exit code 2.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from unicron.core.errors import UnicronError, UsageError
from unicron.core.extras import missing_extra
from unicron.core.taxonomy import TAXONOMY

app = typer.Typer(
    name="unicron",
    help="Self-healing workload manager for LLM training on shared GPU clusters.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.command()
def plan(
    cluster: Annotated[Path, typer.Argument(help="cluster YAML (nodes, GPUs, assignment), first")],
    tasks: Annotated[Path, typer.Argument(help="tasks YAML (a list under 'tasks:'), second")],
    json_output: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    event: Annotated[
        str | None,
        typer.Option(
            help="show the precomputed answer to node-lost:N, node-back (a node joins: with every "
            "node of the file in service, one beyond the cluster's size) or task-done:NAME"
        ),
    ] = None,
) -> None:
    """Print the plan that maximises weighted achieved FLOP/s (WAF) for the cluster: unicron
    plan CLUSTER.yaml TASKS.yaml. GPUs the plan leaves idle are said, with why."""
    from unicron.cli.plan_view import run_plan

    run_plan(cluster, tasks, json_output=json_output, event=event)


TRACE_HELP = (
    "failure trace instead of a generated one: CSV with the header time_hours,node,kind,repair_hours "
    "(one row per failure) or JSON (a list of objects with those keys). kind: one of "
    + ", ".join(k.value for k in TAXONOMY)
    + ". repair_hours: how long the node stays out after a kind that needs a repair ("
    + ", ".join(k.value for k, info in TAXONOMY.items() if info.needs_repair)
    + "); the others ignore it"
)


@app.command()
def simulate(
    scenario: Annotated[Path, typer.Argument(help="scenario YAML (cluster, tasks, days, trace)")],
    trace: Annotated[Path | None, typer.Option(help=TRACE_HELP)] = None,
    json_output: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    plot: Annotated[Path | None, typer.Option(help="write WAF-over-time and lost-WAF plots (PNG)")] = None,
    save_trace: Annotated[Path | None, typer.Option(help="write the trace used, as CSV")] = None,
    span_trace: Annotated[
        bool,
        typer.Option(
            help="lengthen the scenario to the trace's last failure (whole days); without it a failure"
            " past the scenario's end is an error"
        ),
    ] = False,
) -> None:
    """Replay a failure trace against Unicron and the baselines (docs/simulation.md). A run
    longer than a few seconds says on stderr where it is: the policy and the simulated day."""
    from unicron.cli.simulate_view import run_simulate

    run_simulate(
        scenario,
        trace=trace,
        json_output=json_output,
        plot_path=plot,
        save_trace=save_trace,
        span_trace=span_trace,
    )


trace_app = typer.Typer(help="Failure traces for `unicron simulate --trace`.", no_args_is_help=True)
app.add_typer(trace_app, name="trace")


@trace_app.command("convert")
def trace_convert(
    source: Annotated[
        Path, typer.Argument(help="a public dataset's fault file (InfiniteHBD: fault_trace.json)")
    ],
    fmt: Annotated[
        str, typer.Option("--format", help="the dataset's format: infinitehbd (docs/simulation.md)")
    ] = "infinitehbd",
    out: Annotated[
        Path | None, typer.Option(help="write the trace (CSV) here, not to standard output")
    ] = None,
) -> None:
    """Convert a public fault dataset into a trace for `unicron simulate --trace` (CSV rows of
    time_hours,node,kind,repair_hours); what was converted, and how to replay it, on stderr."""
    from unicron.cli.simulate_view import run_convert

    run_convert(source, fmt, out)


URL = Annotated[str, typer.Option("--coordinator", envvar="UNICRON_COORDINATOR", help="coordinator URL")]
TOKEN_FILE = Annotated[
    Path | None,
    typer.Option(
        "--token-file",
        envvar="UNICRON_TOKEN_FILE",
        help="file holding a bearer token (else the token itself in UNICRON_TOKEN)",
    ),
]
CA = Annotated[
    Path | None,
    typer.Option("--ca", envvar="UNICRON_CA", help="CA bundle of the coordinator's TLS certificate"),
]
STATE_DIR = Annotated[Path, typer.Option(help="the coordinator's state directory (its cluster secret)")]


@app.command()
def coordinator(
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on")] = 8470,
    state_dir: STATE_DIR = Path(".unicron/coordinator"),
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
    tls_cert: Annotated[Path | None, typer.Option(help="serve HTTPS with this certificate (PEM)")] = None,
    tls_key: Annotated[Path | None, typer.Option(help="the certificate's private key (PEM)")] = None,
    store: Annotated[
        str | None,
        typer.Option(
            # Escaped: typer reads help as rich markup, where "[/prefix]" is a closing tag.
            help="keep the state in etcd: etcd://host:port\\[,host:port...]\\[/prefix] "
            "(default: SQLite in --state-dir)"
        ),
    ] = None,
) -> None:
    """Run the coordinator service (REST API, agent channel, planner, rendezvous).

    At its first start it creates the cluster secret (mode 0600) in --state-dir; every call
    then needs a token from `unicron token create`."""
    from unicron.cli.live import Serving, run_coordinator

    run_coordinator(
        Serving(host, port, tls_cert, tls_key), state_dir, checkpoint_dir, advertise, settings, cluster, store
    )


@app.command()
def agent(
    coordinator: URL = "http://127.0.0.1:8470",
    slots: Annotated[int, typer.Option(help="worker slots (GPUs) on this node")] = 1,
    node: Annotated[str | None, typer.Option(help="node name (default: the host name)")] = None,
    run_dir: Annotated[Path | None, typer.Option(help="for the socket and worker logs")] = None,
    gpus: Annotated[str | None, typer.Option(help="comma-separated GPU ids, one per slot")] = None,
    address: Annotated[
        str | None,
        typer.Option(
            help="this node's address, where other nodes' workers reach its workers (several "
            "nodes: required; its interface carries their collectives)"
        ),
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            min=0,
            max=65535,
            help="serve Prometheus metrics on this port of the node's address (0: any free one)",
        ),
    ] = None,
    token_file: TOKEN_FILE = None,
    ca: CA = None,
    domain: Annotated[
        str | None,
        typer.Option(
            help="the failure domain this node shares with others (its rack, leaf switch or power "
            "feed): when most of a domain falls silent at once, the coordinator holds its losses"
        ),
    ] = None,
    warm_start: Annotated[
        bool,
        typer.Option(
            "--warm-start/--cold-start",
            help="fork Python workers from a server that has imported torch (the default: a "
            "restarted process costs a fork, not its imports; docs/warm-start.md), or start each "
            "as a new interpreter",
        ),
    ] = True,
    fork_template: Annotated[
        Path | None,
        typer.Option(
            help="fork the fork servers from the template server listening at this socket (one "
            "import of torch for the agents of a local cluster, which starts it; an environment "
            "it does not serve gets a server of its own)",
        ),
    ] = None,
) -> None:
    """Run a node agent: register, heartbeat, launch and supervise workers (with an agent token
    issued for this node)."""
    from unicron.cli.live import run_agent
    from unicron.control.service.credentials import resolve

    credentials = resolve(token_file, ca)
    agent = (coordinator, node, slots, run_dir, gpus, credentials, address, metrics_port, domain)
    run_agent(*agent, warm_start, fork_template)


@app.command()
def submit(
    spec: Annotated[Path, typer.Argument(help="task YAML: one task, or several under 'tasks:'")],
    coordinator: URL = "http://127.0.0.1:8470",
    token_file: TOKEN_FILE = None,
    ca: CA = None,
    no_resolve: Annotated[
        bool,
        typer.Option(
            "--no-resolve",
            help="send the file as written: its relative paths are not made absolute against its "
            "folder, nor is the program checked here (a machine without the nodes' files)",
        ),
    ] = False,
) -> None:
    """Submit tasks to the coordinator (an admin token). Relative paths in run.program are taken
    from the task file's folder and sent absolute; a program that is not there is refused.
    A name whose task has ended (finished, failed, cancelled) runs anew; the ended one is kept
    as NAME#RUN."""
    from unicron.cli.live import Api
    from unicron.cli.live import submit as send

    send(Api.of(coordinator, token_file, ca), spec, resolve=not no_resolve)


@app.command()
def cancel(
    name: str, coordinator: URL = "http://127.0.0.1:8470", token_file: TOKEN_FILE = None, ca: CA = None
) -> None:
    """Cancel a task: its workers stop and its slots are re-planned (an admin token)."""
    from unicron.cli.live import Api
    from unicron.cli.live import cancel as send

    send(Api.of(coordinator, token_file, ca), name)


WATCH = Annotated[float, typer.Option(min=0.2, max=3600, help="seconds between readings")]


@app.command()
def status(
    coordinator: URL = "http://127.0.0.1:8470",
    json_output: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    watch: Annotated[bool, typer.Option("--watch", help="refresh until Ctrl-C")] = False,
    interval: WATCH = 2.0,
    token_file: TOKEN_FILE = None,
    ca: CA = None,
) -> None:
    """Print nodes, slots, tasks, workers and the latest incidents."""
    from unicron.cli.live import Api
    from unicron.cli.live import status as show
    from unicron.cli.watch import watch_status

    api = Api.of(coordinator, token_file, ca)
    if watch and json_output:
        raise UsageError("--watch and --json do not go together: --json prints one reading")
    watch_status(api, interval) if watch else show(api, json_output)


@app.command()
def events(
    coordinator: URL = "http://127.0.0.1:8470",
    task: Annotated[str | None, typer.Option(help="only this task's events")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
    follow: Annotated[
        bool, typer.Option("--follow", help="print new events as they come, until Ctrl-C")
    ] = False,
    interval: WATCH = 1.0,
    token_file: TOKEN_FILE = None,
    ca: CA = None,
) -> None:
    """Print the coordinator's event log and each incident's breakdown."""
    from unicron.cli.live import Api
    from unicron.cli.live import events as show
    from unicron.cli.watch import follow_events

    api = Api.of(coordinator, token_file, ca)
    if follow and json_output:
        raise UsageError("--follow and --json do not go together: --json prints one reading")
    follow_events(api, task, interval) if follow else show(api, task, json_output)


@app.command()
def logs(
    task: Annotated[str, typer.Argument(help="the task's name")],
    rank: Annotated[int, typer.Option(min=0, help="the worker's rank")] = 0,
    generation: Annotated[
        int | None, typer.Option(min=0, help="its generation (default: the newest that had the rank)")
    ] = None,
    tail: Annotated[
        int | None, typer.Option(min=0, help="only the last N lines (default: all, up to one read's cap)")
    ] = None,
    follow: Annotated[
        bool,
        typer.Option("--follow", "-f", help="print new output as it comes, until the worker exits or Ctrl-C"),
    ] = False,
    interval: WATCH = 1.0,
    coordinator: URL = "http://127.0.0.1:8470",
    token_file: TOKEN_FILE = None,
    ca: CA = None,
) -> None:
    """Print a worker's output (stdout and stderr), read from its node through the coordinator
    (a viewer or admin token)."""
    from unicron.cli.live import Api
    from unicron.cli.logs import show_logs

    show_logs(Api.of(coordinator, token_file, ca), task, rank, generation, tail, follow, interval)


node_app = typer.Typer(help="Take nodes out of service and back (an admin token).", no_args_is_help=True)
app.add_typer(node_app, name="node")


@node_app.command("drain")
def node_drain(
    name: str,
    reason: Annotated[str, typer.Option(help="why (recorded with the event)")] = "",
    coordinator: URL = "http://127.0.0.1:8470",
    token_file: TOKEN_FILE = None,
    ca: CA = None,
) -> None:
    """Drain a node: its tasks move off without losing a step; nothing new goes there."""
    from unicron.cli.live import Api, node_action

    node_action(Api.of(coordinator, token_file, ca), name, "drain", {"reason": reason})


@node_app.command("resume")
def node_resume(
    name: str, coordinator: URL = "http://127.0.0.1:8470", token_file: TOKEN_FILE = None, ca: CA = None
) -> None:
    """Put a drained or isolated node back in service (a device fault's node stays out until then)."""
    from unicron.cli.live import Api, node_action

    node_action(Api.of(coordinator, token_file, ca), name, "resume")


@node_app.command("hold-losses")
def node_hold_losses(
    reason: Annotated[str, typer.Option(help="why (recorded with the event)")] = "",
    release: Annotated[bool, typer.Option(help="release the hold instead")] = False,
    coordinator: URL = "http://127.0.0.1:8470",
    token_file: TOKEN_FILE = None,
    ca: CA = None,
) -> None:
    """Hold every node loss: no silent node is declared lost until released (a planned change of
    the network); --release lets the coordinator judge silent nodes again."""
    from unicron.cli.console import console
    from unicron.cli.live import Api

    answer = Api.of(coordinator, token_file, ca).request(
        "POST", "/v1/node-losses", json={"held": not release, "reason": reason}
    )
    console().print("node losses: held" if answer["held"] else "node losses: judged again")


@node_app.command("remove")
def node_remove(
    name: str, coordinator: URL = "http://127.0.0.1:8470", token_file: TOKEN_FILE = None, ca: CA = None
) -> None:
    """Forget a lost node that holds no workers (a retired machine)."""
    from unicron.cli.live import Api, node_action

    node_action(Api.of(coordinator, token_file, ca), name, "remove")


token_app = typer.Typer(
    help="Issue and revoke bearer tokens for the coordinator's API.", no_args_is_help=True
)
app.add_typer(token_app, name="token")


@token_app.command("create")
def token_create(
    role: Annotated[
        str, typer.Option(help="admin (submit, cancel), agent (one node's agent) or viewer (read)")
    ],
    subject: Annotated[
        str | None, typer.Option(help="who it is for; for an agent token, its node's name (required)")
    ] = None,
    state_dir: STATE_DIR = Path(".unicron/coordinator"),
    ttl: Annotated[float | None, typer.Option(help="seconds until it expires (default: never)")] = None,
    output: Annotated[Path | None, typer.Option(help="write it to this file (mode 0600), not stdout")] = None,
) -> None:
    """Issue a token signed with the coordinator's cluster secret (run where --state-dir is)."""
    from unicron.cli.live import create_token

    create_token(role, subject, state_dir, ttl, output)


@token_app.command("revoke")
def token_revoke(
    token_file: Annotated[Path | None, typer.Option(help="the file holding the token to revoke")] = None,
    ident: Annotated[
        str | None, typer.Option("--id", help="or the token's id, as `token create` printed it")
    ] = None,
    state_dir: STATE_DIR = Path(".unicron/coordinator"),
    coordinator: Annotated[
        str | None,
        typer.Option(help="revoke through the API (kept in the store: every coordinator refuses it)"),
    ] = None,
    admin_token_file: Annotated[
        Path | None,
        typer.Option(envvar="UNICRON_TOKEN_FILE", help="with --coordinator: the admin token to call it with"),
    ] = None,
    ca: CA = None,
) -> None:
    """Take back one token: the coordinator refuses it from its next call (others stay valid).
    Without --coordinator, on the coordinator's host (its --state-dir); with several
    coordinators, through the API."""
    from unicron.cli.live import Api, revoke_token

    api = Api.of(coordinator, admin_token_file, ca) if coordinator else None
    revoke_token(state_dir, token_file, ident, api)


slurm_app = typer.Typer(
    help="Run Unicron inside a Slurm allocation (deploy/slurm/unicron.sbatch).", no_args_is_help=True
)
app.add_typer(slurm_app, name="slurm")
SLURM_ROOT = Annotated[
    Path | None,
    typer.Option(
        help="shared folder for state, checkpoints, tokens and logs; a relative one is taken from "
        "the job's working folder (default: WORKDIR/.unicron/slurm-JOBID, made absolute)"
    ),
]
SLOTS = Annotated[
    int,
    typer.Option(help="worker slots per node (default: the GPUs Slurm gave each node, else 1: a CPU worker)"),
]


@slurm_app.command("run")
def slurm_run(
    specs: Annotated[list[Path], typer.Argument(help="task YAML files to run to their end")],
    root: SLURM_ROOT = None,
    port: Annotated[int, typer.Option(help="the coordinator's port on the head node")] = 8470,
    slots: SLOTS = 0,
    settings: Annotated[Path | None, typer.Option(help="the coordinator's settings YAML")] = None,
    cluster: Annotated[Path | None, typer.Option(help="the planner's hardware inputs YAML")] = None,
    wait: Annotated[float, typer.Option(help="seconds to wait for the coordinator and agents")] = 180.0,
) -> None:
    """The batch script's command: the coordinator on the first node, an agent on every node
    (one srun step), the tasks submitted and followed to their end; exit 0 when all finished."""
    from unicron.cli.slurm import run

    raise typer.Exit(run(specs, root, port, slots, settings, cluster, wait))


@slurm_app.command("node")
def slurm_node(
    root: Annotated[Path, typer.Option(help="the job's shared folder")],
    port: Annotated[int, typer.Option(help="the coordinator's port on the head node")] = 8470,
    slots: SLOTS = 0,
    settings: Annotated[Path | None, typer.Option(help="the coordinator's settings YAML")] = None,
    cluster: Annotated[Path | None, typer.Option(help="the planner's hardware inputs YAML")] = None,
) -> None:
    """One node's part (started by `slurm run` with srun): the agent, and on the first node the
    coordinator, kept running until the step ends."""
    from unicron.cli.slurm import node

    raise typer.Exit(node(root, port, slots, settings, cluster))


@app.command()
def demo(
    root: Annotated[Path | None, typer.Option(help="where state and logs go (default: a new folder)")] = None,
    hosts: Annotated[
        int | None,
        typer.Option(
            help="run across this many test hosts (network namespaces, as root), each agent and "
            "the coordinator on a host of its own; a node is lost by cutting its link"
        ),
    ] = None,
) -> None:
    """Run the live demo on an embedded local cluster (what `make demo` runs)."""
    import time as _time

    from unicron.cli.demo import run_demo

    folder = root or Path(f".unicron/demo-{_time.strftime('%Y%m%d-%H%M%S')}")
    raise typer.Exit(run_demo(folder, hosts=hosts))


@app.callback()
def root() -> None:
    """Self-healing workload manager for LLM training on shared GPU clusters."""


def main(argv: list[str] | None = None) -> None:
    try:
        app(args=argv)
    except UnicronError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except ModuleNotFoundError as exc:  # a command whose extra is not installed (core/extras.py)
        missing = missing_extra(exc, "this command")
        if missing is None:
            raise
        print(f"error: {missing}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:  # Ctrl-C ends --watch, --follow and long commands: no traceback
        sys.exit(130)


if __name__ == "__main__":
    main()

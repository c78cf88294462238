"""Commands for the live system: run the coordinator or an agent, submit, cancel, status."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

import httpx
from rich.table import Table
from rich.text import Text

from unicron.cli.console import console
from unicron.cli.files import read_text
from unicron.core.errors import UnicronError
from unicron.core.livespecs import DEFAULT_LIVE_CLUSTER, LiveClusterSpec, parse_live_cluster
from unicron.core.settings import Settings
from unicron.core.specs import load_yaml_text, validate_spec
from unicron.planning.planner import flops

DEFAULT_URL = os.environ.get("UNICRON_COORDINATOR", "http://127.0.0.1:8470")


def load_settings(path: Path | None) -> Settings:
    """Detection and handling settings from a YAML file; the timeout ordering is checked here."""
    if path is None:
        return Settings()
    return validate_spec(Settings, load_yaml_text(read_text(path), str(path)) or {}, str(path))


def load_cluster(path: Path | None) -> LiveClusterSpec:
    """The planner's hardware inputs (GPU, node MTBF, transition settings) from a YAML file."""
    if path is None:
        return DEFAULT_LIVE_CLUSTER
    return parse_live_cluster(read_text(path), str(path))


def run_coordinator(
    host: str,
    port: int,
    state_dir: Path,
    checkpoint_dir: Path | None,
    advertise: str | None,
    settings_file: Path | None = None,
    cluster_file: Path | None = None,
) -> None:
    import uvicorn

    from unicron.control.coordinator import CoordinatorSettings
    from unicron.control.service import create_app

    settings = CoordinatorSettings(
        state_dir=state_dir,
        checkpoint_root=checkpoint_dir or state_dir / "checkpoints",
        advertise_host=advertise or (host if host not in ("0.0.0.0", "::") else socket.gethostname()),
        cluster=load_cluster(cluster_file),
        limits=load_settings(settings_file),
    )
    uvicorn.run(create_app(settings), host=host, port=port, log_level="warning")


def run_agent(url: str, node: str | None, slots: int, run_dir: Path | None, gpus: str | None) -> None:
    from unicron.control.agent import run_agent as start

    name = node or socket.gethostname()
    devices = [g for g in (gpus or "").split(",") if g]
    start(url, name, slots, run_dir or Path(f".unicron/agents/{name}"), devices)


def _request(method: str, url: str, **kwargs: Any) -> Any:
    try:
        response = httpx.request(method, url, timeout=10.0, **kwargs)
    except httpx.HTTPError as exc:
        raise UnicronError(f"cannot reach the coordinator at {url} ({exc}); is it running?") from None
    if response.status_code >= 400:
        try:
            body = response.json()
        except ValueError:
            body = {"error": response.text}
        raise UnicronError(body.get("error", response.text))
    return response.json()


def submit(url: str, spec: Path) -> None:
    created = _request(
        "POST",
        f"{url}/v1/tasks",
        content=read_text(spec).encode(),
        headers={"content-type": "application/yaml"},
    )
    for task in created:
        console().print(
            f"submitted {task['name']} (weight {task['weight']:g}, {task['iterations']} iterations)"
        )


def cancel(url: str, name: str) -> None:
    task = _request("DELETE", f"{url}/v1/tasks/{name}")
    console().print(f"{task['name']}: {task['state']}")


def events(url: str, task: str | None, json_output: bool) -> None:
    rows = _request("GET", f"{url}/v1/events", params={"task": task} if task else {})
    if json_output:
        print(json.dumps(rows, indent=2))
        return
    table = Table("id", "time", "kind", "task", "node", "detail")
    for e in rows:
        detail = ", ".join(f"{k}={v}" for k, v in e["detail"].items())
        table.add_row(
            str(e["id"]), f"{e['time']:.3f}", e["kind"], e["task"] or "", e["node"] or "", Text(detail)
        )
    console().print(table)


def task_table(tasks: list[dict[str, Any]], title: str = "Tasks") -> Table:
    """Tasks as a table: shared by `unicron status` and the demo."""
    table = Table(
        "task",
        "weight",
        "state",
        "workers",
        "gen",
        "step",
        "checkpoint",
        "failures",
        "downtime",
        "WAF (FLOP/s)",
        title=title,
        title_justify="left",
    )
    for t in tasks:
        table.add_row(
            t["name"],
            f"{t['weight']:g}",
            t["state"],
            str(t["workers"]),
            str(t["generation"]),
            f"{t['step']}/{t['iterations']}",
            str(t["checkpoint_step"]),
            str(t["failures"]),
            f"{t['downtime_s']:.1f} s",
            flops(t["waf"]),
        )
    return table


def status(url: str, json_output: bool) -> None:
    nodes = _request("GET", f"{url}/v1/nodes")
    tasks = _request("GET", f"{url}/v1/tasks")
    workers = _request("GET", f"{url}/v1/workers")
    if json_output:
        print(json.dumps({"nodes": nodes, "tasks": tasks, "workers": workers}, indent=2))
        return
    out = console()
    table = Table("node", "state", "slots", "used", "heartbeat", title="Nodes", title_justify="left")
    for n in nodes:
        used = ", ".join(f"{t}:{k}" for t, k in n["used"].items()) or "-"
        table.add_row(
            n["name"], n["state"], str(n["slots"]), used, f"{n['seconds_since_heartbeat']:.1f} s ago"
        )
    out.print(table)
    table = task_table(tasks)
    out.print(table)
    table = Table(
        "task", "gen", "rank", "node", "local", "state", "pid", "exit", title="Workers", title_justify="left"
    )
    for w in workers:
        code = (
            ""
            if w["exit_code"] is None and w["exit_signal"] is None
            else (f"signal {w['exit_signal']}" if w["exit_signal"] else str(w["exit_code"]))
        )
        table.add_row(
            w["task"],
            str(w["generation"]),
            str(w["rank"]),
            w["node"],
            str(w["local_rank"]),
            w["state"],
            str(w["pid"] or ""),
            code,
        )
    out.print(table)
    out.print(incident_table(_request("GET", f"{url}/v1/events")))


def incident_table(events: list[dict[str, Any]], last: int = 10) -> Table:
    """The latest incidents: when detected, how fast, kind, severity, action and outcome."""
    outcomes = {e["detail"].get("incident"): e["detail"] for e in events if e["kind"] == "outcome"}
    causes = {e["detail"]["incident"]: e["detail"] for e in events if e["kind"] == "root_cause"}
    table = Table(
        "id",
        "task",
        "node",
        "kind",
        "severity",
        "action",
        "detected in",
        "outcome",
        "downtime",
        title="Incidents",
        title_justify="left",
    )
    incidents = [e for e in events if e["kind"] == "incident"][-last:]
    for e in incidents:
        d = e["detail"]
        outcome = outcomes.get(e["id"], {})
        latency = "-" if d.get("detection_s") is None else f"{d['detection_s']:.2f} s"
        downtime = "-" if outcome.get("downtime_s") is None else f"{outcome['downtime_s']:.1f} s"
        cause = causes.get(e["id"])
        kind = d["kind"] if cause is None else f"{cause['kind']} (first seen as {d['kind']})"
        table.add_row(
            str(e["id"]),
            e["task"] or "",
            cause["lost_node"] if cause else e["node"] or "",
            kind,
            d["severity"],
            d["action"],
            latency,
            outcome.get("outcome", "open"),
            downtime,
        )
    return table

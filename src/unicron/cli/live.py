"""Commands for the live system: run the coordinator or an agent, submit, cancel, status."""

from __future__ import annotations

import faulthandler
import json
import socket
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
from rich.console import Group
from rich.table import Table
from rich.text import Text

from unicron.cli.console import console
from unicron.cli.files import read_text
from unicron.control.service.credentials import Credentials, resolve, write_token
from unicron.core.access import Role
from unicron.core.coordinators import parse_coordinators
from unicron.core.errors import UnicronError, UsageError
from unicron.core.limits import MAX_LABEL_CHARS, MAX_SLOTS
from unicron.core.livespecs import DEFAULT_LIVE_CLUSTER, LiveClusterSpec, parse_live_cluster
from unicron.core.names import check_name
from unicron.core.safeyaml import load_yaml_text
from unicron.core.settings import Settings
from unicron.core.specs import validate_spec
from unicron.planning.planner import flops


def load_settings(path: Path | None) -> Settings:
    """Detection and handling settings from a YAML file; the timeout ordering is checked here."""
    if path is None:
        return Settings()
    return validate_spec(Settings, load_yaml_text(read_text(path), str(path)) or {}, str(path))


def check_store(url: str | None) -> str | None:
    """``--store``: a well-formed etcd URL whose cluster answers now (else a clear error)."""
    if url is None:
        return None
    from unicron.control.store.etcdbackend import EtcdClients, parse_url

    endpoints, _ = parse_url(url)
    try:
        EtcdClients(endpoints, timeout_s=3.0).post("maintenance/status", {})
    except ConnectionError as exc:
        raise UsageError(f"--store {url}: {exc}; start etcd there or give its client address") from None
    return url


def load_cluster(path: Path | None) -> LiveClusterSpec:
    """The planner's hardware inputs (GPU, node MTBF, transition settings) from a YAML file."""
    if path is None:
        return DEFAULT_LIVE_CLUSTER
    return parse_live_cluster(read_text(path), str(path))


@dataclass(frozen=True)
class Serving:
    """Where and how the coordinator listens: HTTPS when given a certificate and its key."""

    host: str
    port: int
    tls_cert: Path | None = None
    tls_key: Path | None = None

    def uvicorn_args(self) -> dict[str, Any]:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise UsageError("--tls-cert and --tls-key go together: pass both (PEM files) or neither")
        for path in (self.tls_cert, self.tls_key):
            if path is not None and not path.is_file():
                raise UsageError(f"the TLS file {path} does not exist: pass the PEM certificate and key")
        tls = {"ssl_certfile": str(self.tls_cert), "ssl_keyfile": str(self.tls_key)} if self.tls_cert else {}
        return {"host": self.host, "port": self.port, **tls}


def run_coordinator(
    serving: Serving,
    state_dir: Path,
    checkpoint_dir: Path | None,
    advertise: str | None,
    settings_file: Path | None = None,
    cluster_file: Path | None = None,
    store: str | None = None,
) -> None:
    from unicron.cli.announce import serve, started_lines
    from unicron.control.coordinator import CoordinatorSettings
    from unicron.control.service.service import create_app

    faulthandler.enable()  # a native crash (torch's store, SQLite) leaves its stacks in the log

    listen = serving.uvicorn_args()
    host = serving.host
    reachable = advertise or (host if host not in ("0.0.0.0", "::") else socket.gethostname())
    settings = CoordinatorSettings(
        state_dir=state_dir,
        checkpoint_root=checkpoint_dir or state_dir / "checkpoints",
        advertise_host=reachable,
        url=f"{'https' if 'ssl_certfile' in listen else 'http'}://{reachable}:{serving.port}",
        cluster=load_cluster(cluster_file),
        limits=load_settings(settings_file),
        store=check_store(store),
    )
    lines = started_lines(settings.url, f"{host}:{serving.port}", state_dir, settings.store)
    serve(create_app(settings), listen, lines)


def run_agent(
    url: str,
    node: str | None,
    slots: int,
    run_dir: Path | None,
    gpus: str | None,
    credentials: Credentials,
    address: str | None = None,
    metrics_port: int | None = None,
    domain: str | None = None,
    warm_start: bool = True,
    fork_template: Path | None = None,
) -> None:
    from unicron.control.agent.agent import run_agent as start
    from unicron.control.agent.hostaddress import AddressError, NodeAddress, interface_of

    faulthandler.enable()  # a native crash leaves its stacks in the log

    name = check_name(node or socket.gethostname(), "--node")
    if domain is not None:
        check_name(domain, "--domain")
    devices = [g for g in (gpus or "").split(",") if g]
    check_node_size(slots, devices)
    try:
        where = NodeAddress(address, interface_of(address)) if address else NodeAddress()
    except AddressError as exc:
        raise UsageError(str(exc)) from None
    folder = run_dir or Path(f".unicron/agents/{name}")
    start(
        url, name, slots, folder, devices, credentials, where, metrics_port, domain, warm_start, fork_template
    )


def check_node_size(slots: int, gpus: list[str]) -> None:
    """Refuse at start what the coordinator would refuse at every registration (``core/limits.py``),
    rather than let the agent retry for ever."""
    if not 1 <= slots <= MAX_SLOTS:
        raise UsageError(f"--slots {slots}: give 1 to {MAX_SLOTS} worker slots (GPUs) for one node")
    if len(gpus) > MAX_SLOTS:
        raise UsageError(f"--gpus: {len(gpus)} ids; give at most {MAX_SLOTS} (one per slot)")
    long = next((g for g in gpus if len(g) > MAX_LABEL_CHARS), None)
    if long is not None:
        raise UsageError(f"--gpus: an id of {len(long)} characters; give ids of at most {MAX_LABEL_CHARS}")


def create_token(
    role: str, subject: str | None, state_dir: Path, ttl: float | None, output: Path | None
) -> None:
    from unicron.control.service.tokens import issue, token_id
    from unicron.control.store.secret import read_secret

    try:
        kind = Role(role)
    except ValueError:
        raise UsageError(f"--role {role!r} is not a role: use admin, agent or viewer") from None
    if kind is Role.AGENT and subject is None:
        raise UsageError("an agent token speaks for one node: pass --subject <node name>")
    secret = read_secret(state_dir)
    token = issue(secret, kind, subject or kind.value, ttl)
    ident = token_id(secret, token)["jti"]
    if output is None:
        print(token)
        print(f"token id {ident} (for `unicron token revoke --id`)", file=sys.stderr)
    else:
        write_token(output, token)
        console().print(f"wrote a {kind.value} token for {subject or kind.value} to {output} (id {ident})")


def revoke_token(state_dir: Path, token_file: Path | None, ident: str | None, api: Api | None = None) -> None:
    from unicron.control.service.revocation import revoke
    from unicron.control.service.tokens import token_id, unverified_id
    from unicron.control.store.secret import read_secret
    from unicron.core.access import check_token_id

    if (token_file is None) == (ident is None):
        raise UsageError("name the token to revoke: --token-file FILE or --id ID (one of them)")
    if token_file is not None:
        try:
            text = token_file.read_text().strip()
        except OSError as exc:
            raise UsageError(f"--token-file {token_file}: {exc.strerror}") from None
        # Through the API the coordinator's secret is not at hand: the id is read, not checked.
        record = unverified_id(text) if api is not None else token_id(read_secret(state_dir), text)
    else:
        assert ident is not None
        record = {"jti": ident}
    check_token_id(record["jti"])
    if api is not None:
        api.request("POST", "/v1/tokens/revoked", json=record)
        console().print(f"revoked token {record['jti']}: every coordinator refuses it from now on")
        return
    revoke(state_dir, record)
    console().print(f"revoked token {record['jti']}: the coordinator refuses it from its next call")


@dataclass(frozen=True)
class Api:
    """The coordinator's URL and the credentials the CLI calls it with."""

    url: str
    credentials: Credentials

    @classmethod
    def of(cls, url: str, token_file: Path | None, ca: Path | None) -> Api:
        return cls(url.rstrip("/"), resolve(token_file, ca))

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """Call the coordinator; with several addresses (``--coordinator A,B``), the first that
        accepts the connection (the leader: standbys keep their ports closed). A request is
        sent on to the next address only when it could not connect, so it is never made twice."""
        urls = parse_coordinators(self.url)
        own = self.credentials
        with httpx.Client(timeout=10.0, headers=own.headers, verify=own.verify) as client:
            for i, url in enumerate(urls):
                try:
                    response = client.request(method, f"{url}{path}", **kwargs)
                    break
                except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                    if i + 1 < len(urls):
                        continue
                    raise UnicronError(
                        f"cannot reach the coordinator at {self.url} ({exc}); is it running?"
                    ) from None
                except httpx.HTTPError as exc:
                    raise UnicronError(f"the coordinator at {url} did not answer ({exc})") from None
        if response.status_code >= 400:
            try:
                body = response.json()
            except ValueError:
                body = {"error": response.text}
            raise UnicronError(body.get("error", response.text))
        return response.json()


def submit(api: Api, spec: Path, resolve: bool = True) -> None:
    """Submit a task file, its relative paths made absolute against its folder and its program
    checked first (``control/launch/taskfile.py``; ``resolve`` False: as written)."""
    from unicron.control.launch.taskfile import read_task_file

    escape = "; from a machine without the nodes' files, --no-resolve sends it as written"
    text = read_task_file(spec, resolve, escape).text
    created = api.request(
        "POST", "/v1/tasks", content=text.encode(), headers={"content-type": "application/yaml"}
    )
    for task in created:
        line = f"submitted {task['name']} (weight {task['weight']:g}, {task['iterations']} iterations)"
        if (run := task.get("run", 1)) > 1:
            line += f": its run {run}, the ended one kept as {task['name']}#{run - 1}"
        console().print(line, markup=False)


def cancel(api: Api, name: str) -> None:
    task = api.request("DELETE", f"/v1/tasks/{check_name(name, 'task name')}")
    if task.get("cancelled", True):
        console().print(f"{task['name']}: {task['state']}")
        return
    # Ended already: nothing to stop. Said plainly, with what can be done with it.
    ended = "been cancelled" if task["state"] == "cancelled" else task["state"]
    console().print(
        f"{task['name']} has already {ended} (at step {task['step']}/{task['iterations']}): "
        "nothing to cancel; its name is free, `unicron submit` runs it anew",
        markup=False,
    )


def node_action(api: Api, name: str, action: str, body: dict[str, Any] | None = None) -> None:
    """Drain, resume or remove a node; prints its state afterwards."""
    path = f"/v1/nodes/{check_name(name, 'node name')}"
    if action == "remove":
        api.request("DELETE", path)
        console().print(f"{name}: removed")
        return
    api.request("POST", f"{path}/{action}", json=body)
    state = next((n["state"] for n in api.request("GET", "/v1/nodes") if n["name"] == name), "?")
    console().print(f"{name}: {state}")


def events(api: Api, task: str | None, json_output: bool) -> None:
    rows = api.request("GET", "/v1/events", params={"task": task} if task else {})
    incidents = api.request("GET", "/v1/incidents", params={"task": task} if task else {})
    if json_output:
        print(json.dumps({"events": rows, "incidents": incidents}, indent=2))
        return
    table = Table("id", "time", "kind", "task", "node", "detail")
    for e in rows:
        table.add_row(*event_cells(e))
    console().print(table)
    console().print(incident_table(incidents, last=len(incidents), phases=True))


def event_cells(e: dict[str, Any]) -> tuple[str, str, str, str, str, Text]:
    detail = ", ".join(f"{k}={plain(v, k)}" for k, v in e["detail"].items())
    return str(e["id"]), local_time(e["time"]), e["kind"], e["task"] or "", e["node"] or "", Text(detail)


# Detail keys that hold a moment (Unix time), shown as local times like the time column.
MOMENT_KEYS = ("_at", "_since", "_until")
DETAIL_TEXT_CHARS = 300  # a long text (a log's tail, a stack) is cut: `--json` has all of it


def local_time(at: float, date: bool = True) -> str:
    """A Unix time as this machine's local time, to the millisecond."""
    moment = datetime.fromtimestamp(at)
    return moment.strftime("%Y-%m-%d %H:%M:%S" if date else "%H:%M:%S") + f".{moment.microsecond // 1000:03d}"


def plain(value: Any, key: str = "") -> str:
    """An event's detail value as a person reads it: moments as local times, numbers rounded,
    lists and mappings without Python's quotes, long or multi-line text on one line, cut."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float) and key.endswith(MOMENT_KEYS) and value > 1e9:
        return local_time(value, date=False)
    if isinstance(value, float):
        return f"{value:.3f}".rstrip("0").rstrip(".") if abs(value) < 1e6 else f"{value:.4g}"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {plain(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(plain(v) for v in value) + "]"
    text = " | ".join(line.strip() for line in str(value).splitlines() if line.strip())
    return text if len(text) <= DETAIL_TEXT_CHARS else text[: DETAIL_TEXT_CHARS - 3] + "..."


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


def status(api: Api, json_output: bool) -> None:
    if json_output:
        nodes, tasks, workers = (api.request("GET", f"/v1/{what}") for what in ("nodes", "tasks", "workers"))
        print(json.dumps({"nodes": nodes, "tasks": tasks, "workers": workers}, indent=2))
        return
    console().print(status_view(api))


def status_view(api: Api) -> Group:
    """What `unicron status` shows (and `--watch` refreshes): nodes, tasks, workers, incidents."""
    nodes = api.request("GET", "/v1/nodes")
    tasks = api.request("GET", "/v1/tasks")
    workers = api.request("GET", "/v1/workers")
    domains = any(n.get("domain") for n in nodes)  # a column only where nodes named their domain
    columns = ["node", "address", *(["domain"] if domains else []), "state", "slots", "used", "heartbeat"]
    table = Table(*columns, title="Nodes", title_justify="left")
    for n in nodes:
        used = ", ".join(f"{t}:{k}" for t, k in n["used"].items()) or "-"
        age = n["seconds_since_heartbeat"]
        # A lost node's agent cannot reach the coordinator (or is down): say so, not only an age.
        beat = f"none for {age:.1f} s: unreachable" if n["state"] == "lost" else f"{age:.1f} s ago"
        domain = [n.get("domain") or "-"] if domains else []
        table.add_row(n["name"], n["host"], *domain, n["state"], str(n["slots"]), used, beat)
    shown: list[Table | Text] = [*losses_held(api), table, task_table(tasks)]
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
    incidents = api.request("GET", "/v1/incidents", params={"last": 10})
    shown += [table, incident_table(incidents), *worker_output(incidents, tasks)]
    return Group(*shown)


def losses_held(api: Api) -> list[Text]:
    """A line above the nodes while node losses are held back (``docs/detection.md``): silent
    nodes are not declared lost, so an operator must know."""
    losses = api.request("GET", "/v1/node-losses")
    now = losses.get("now")
    if now is None:  # a coordinator that does not say
        return []
    why = [f"by hand ({losses['reason'] or 'no reason given'})"] if now["by_hand"] else []
    why += [now["alarm"]] if now["alarm"] else []
    why += [f"failure domain {d} partly silent" for d in now["domains"]]
    if not why and not now["nodes"]:
        return []
    held = f"{now['nodes']} silent node(s) not declared lost" if now["nodes"] else "no silent node yet"
    return [Text(f"Node losses held: {'; '.join(why) or 'the node loss rate spent'}: {held}", style="bold")]


def worker_output(incidents: list[dict[str, Any]], tasks: list[dict[str, Any]]) -> list[Text]:
    """For each task whose latest incident (of ``incidents``, oldest first; not one of an earlier
    task of its name) was a worker that ended before its first step: how it ended, where its
    output is, and the output's last lines (a bad path, an import error, an argument: what the
    script itself said)."""
    submitted = {t["name"]: t["submitted"] for t in tasks}
    latest = {b["task"]: b for b in incidents if b["detected_at"] >= submitted.get(b["task"], float("inf"))}
    shown: list[Text] = []
    for task, b in latest.items():
        if b.get("log") is None:
            continue
        shown.append(Text(f"{task}, incident {b['incident']}: {b['why']}", style="bold"))
        tail = b.get("log_tail") or "(it wrote nothing)"
        shown.append(Text("\n".join(f"  | {line}" for line in tail.splitlines())))
    return shown


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f} s"


def incident_table(incidents: list[dict[str, Any]], last: int = 10, phases: bool = False) -> Table:
    """The latest incidents, each with what it cost (``control/observe/breakdown.py``): detection,
    downtime, lost work, the ladder's actions and the outcome; with ``phases`` also the fault's
    source and the decision, transition and first step (``unicron events``)."""
    table = Table(title="Incidents", title_justify="left")
    timed = ("fault", "detection", "decision", "transition", "first step") if phases else ("detection",)
    for name in ("id", "task", "node", "kind", "sev", *timed, "downtime", "lost", "actions", "outcome"):
        # Names are never cut (they are what one searches for); the rest folds onto more lines.
        table.add_column(name, no_wrap=name in ("id", "kind", "sev", "outcome"), overflow="fold")
    for b in incidents[-last:]:
        s = b["seconds"]
        first = b["first_seen_as"]
        kind = b["kind"] if first is None else f"{b['kind']} (first seen as {first})"
        steps = "?" if b["lost_steps"] is None else b["lost_steps"]
        times = [seconds(s[p]) for p in ("detection", "decision", "transition", "first_step")]
        shown = [b["fault_source"] or "-", *times] if phases else times[:1]
        table.add_row(
            str(b["incident"]),
            b["task"] or "",
            b["node"] or "",
            kind,
            b["severity"],
            *shown,
            seconds(b["downtime_s"]),
            f"{steps} steps, {b['lost_micro_batches']} mb",
            " -> ".join(b["actions"]),
            b["outcome"] or "open",
        )
    return table

"""An embedded local cluster: a real coordinator and real agents as processes on loopback, or
(given ``hosts``) each on a test host of its own (``testhosts.py``): the coordinator on the
first, an agent on each next one, every party bound to its host's address, and this process's
own calls to the coordinator made from inside the coordinator's host.

Used by ``make demo`` and the end-to-end tests. Every process it starts is in its own process
group and is killed on close (also on Ctrl-C or interpreter exit); workers die with their agent.
On loopback its coordinators and agents are forked from the standard library's fork server
(``forked.py``): a program that starts one guards its main code, as ``multiprocessing`` asks.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from unicron.control.agent.template import Template
from unicron.control.agent.warmstart import preloaded
from unicron.control.launch.forked import Forked, Started
from unicron.control.launch.testhosts import Host, InNamespace, TestHosts
from unicron.control.private import private_log
from unicron.control.service.credentials import Credentials, read_token, write_token
from unicron.control.service.tokens import issue
from unicron.control.store.secret import load_or_create_secret
from unicron.core.access import Role
from unicron.core.errors import UnicronError
from unicron.core.states import SLOT_HOLDING_PHASES
from unicron.core.workerenv import host_checkpoint_dir

PORT_TRIES = 3
# The template this process's clusters fork their agents' fork servers from (``template.py``):
# one import of torch for all of them, started by the first cluster that needs it and ended with
# this process. An agent on a test host gets a server that enters its host's network namespace.
TEMPLATES: list[Template] = []
# Variables that may differ between the template and the agents it serves: set by a test runner
# per test (pytest's name of the test under way), read by no import.
PER_TEST = ("PYTEST_CURRENT_TEST",)
# ... and variables read when a worker forms its groups, not by an import: an agent on a test
# host names its host's interface for gloo (``control/agent/hostaddress.py``).
READ_AT_RUN = ("GLOO_SOCKET_IFNAME",)


def shared_template() -> Template | None:
    """This process's template, started if need be; None where it does not serve (the agents'
    servers then import torch themselves)."""
    if TEMPLATES and not TEMPLATES[0].serving:
        TEMPLATES.pop().close()
    if not TEMPLATES:
        template = Template(preloaded({}), PER_TEST + READ_AT_RUN)
        atexit.register(template.close)
        TEMPLATES.append(template)
    return TEMPLATES[0] if TEMPLATES[0].serving else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class TlsFiles:
    """The coordinator's certificate and key, and the CA that clients check it against (PEM)."""

    cert: Path
    key: Path
    ca: Path


class LocalCluster:
    def __init__(
        self,
        root: Path,
        nodes: int = 4,
        slots: int = 2,
        port: int | None = None,
        settings: dict[str, Any] | None = None,
        cluster: Path | None = None,
        tls: TlsFiles | None = None,
        hosts: TestHosts | None = None,
        agent_metrics: bool = False,
        store: str | None = None,
        coordinators: int = 1,
        gpus: list[str] | None = None,
        domains: dict[str, str] | None = None,
        warm_start: bool = True,
    ) -> None:
        self.root = root
        self.warm_start = warm_start  # agents fork Python workers from a fork server (warmstart.py)
        self.domains = domains or {}  # node -> its agent's --domain (a rack, a switch)
        self.gpus = gpus or []  # each agent's --gpus (one id per slot; a GPU machine's)
        self.tls = tls
        self.settings = settings or {}
        self.cluster = cluster  # the planner's hardware inputs (coordinator --cluster)
        self.node_names = [f"node-{i}" for i in range(nodes)]
        # node -> the port its agent serves its metrics on (``agent_metrics``; loopback only)
        self.agent_metrics = {n: free_port() for n in self.node_names} if agent_metrics else {}
        self.slots = slots
        self.hosts = hosts
        self.store = store
        self._address(port, coordinators)
        self.coordinators: dict[int, Started] = {}
        self.leading = 0  # the coordinator this process's calls reached last
        self.agents: dict[str, Started] = {}
        self.frozen: list[tuple[Started, list[int]]] = []
        # The coordinator's secret exists before it starts, so that every party gets its token
        # the way an operator would hand it out: a file per agent, an admin token for us.
        self.secret = load_or_create_secret(root / "coordinator")
        self.admin_token = self.token_file(Role.ADMIN, "local-admin")
        self.credentials = Credentials(read_token(self.admin_token), tls.ca if tls else None)
        self.client = self._here(
            httpx.Client,
            timeout=10.0,
            headers=self.credentials.headers,
            verify=self.credentials.verify,
        )
        atexit.register(self.close)

    def _address(self, port: int | None, coordinators: int) -> None:
        """Where the coordinators listen: on the first test host (``hosts``), else on loopback."""
        hosts = self.hosts
        self.host_of: dict[str, Host] = {}  # node -> its test host (with ``hosts``)
        self.net: InNamespace | None = None  # where this process's calls are made from
        self.address = "127.0.0.1"
        if hosts is not None:
            if len(hosts.hosts) < (nodes := len(self.node_names)) + 1:
                raise ValueError(f"{nodes} nodes and the coordinator need {nodes + 1} test hosts")
            self.coordinator_host = hosts.hosts[0]
            self.host_of = dict(zip(self.node_names, hosts.hosts[1:], strict=False))
            self.net = hosts.client(self.coordinator_host)
            self.address = self.coordinator_host.address
        self.port = port or (8470 if hosts is not None else free_port())  # a host's ports are all free
        # Several coordinators (``store`` etcd): one leads, the others stand by on ports of their own.
        self.ports = [self.port] + [free_port() for _ in range(coordinators - 1)]
        # Each on a loopback address of its own (as on hosts of their own): after a takeover the
        # running tasks' stores are served at another address, which their workers must find.
        self.addresses = [self.address] + [
            self.address if hosts is not None else f"127.0.0.{i + 2}" for i in range(coordinators - 1)
        ]
        # Loopback ports picked free here (another process may take one before it is bound).
        self.ports_picked = hosts is None and port is None
        self._urls()

    def _urls(self) -> None:
        self.port = self.ports[0]
        scheme = "https" if self.tls else "http"
        self.urls = [f"{scheme}://{a}:{p}" for a, p in zip(self.addresses, self.ports, strict=True)]
        self.url = ",".join(self.urls)  # what agents are given

    def _here(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn`` where this process's connections to the cluster are made: on the
        coordinator's test host (its namespace), or here on loopback."""
        return fn(*args, **kwargs) if self.net is None else self.net.call(fn, *args, **kwargs)

    def command(self, argv: list[str], node: str | None = None) -> list[str]:
        """``argv`` as run on ``node``'s host (None: the coordinator's), e.g. a CLI call."""
        if self.hosts is None:
            return argv
        return self.hosts.command(self.host_of[node] if node else self.coordinator_host, argv)

    # ------------------------------------------------------------------ processes
    def _spawn(self, args: list[str], log: Path, node: str | None = None) -> Started:
        """``unicron ARGS`` on ``node``'s host (None: the coordinator's): forked from this
        process's fork server on loopback (``forked.py``), else started on the test host."""
        with private_log(log) as out:
            if self.hosts is None:
                return Forked(args, log)
            return subprocess.Popen(
                self.command([sys.executable, "-m", "unicron.cli.main", *args], node),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def token_file(self, role: Role, subject: str) -> Path:
        """A token file (mode 0600) for ``role`` and ``subject``, under the cluster's root."""
        path = self.root / "tokens" / f"{role.value}-{subject}.token"
        write_token(path, issue(self.secret, role, subject))
        return path

    def start(self) -> LocalCluster:
        self.start_coordinators()
        for name in self.node_names:
            self.start_agent(name)
        self.wait(
            lambda: sum(n["state"] == "healthy" for n in self.get("/v1/nodes")) == len(self.node_names),
            60,
            "agents to register",
        )
        return self

    @property
    def coordinator(self) -> Started | None:
        """The first coordinator's process (the only one without ``coordinators``)."""
        return self.coordinators.get(0)

    def start_coordinators(self) -> None:
        """Every coordinator; returns once one leads (the others stand by). A port picked free
        here but taken by another process before the coordinator bound it is replaced by another
        (up to ``PORT_TRIES`` times), before any agent was told the address."""
        for index in range(len(self.ports)):
            self.start_coordinator(index, wait=False)
        for _ in range(PORT_TRIES if self.ports_picked else 0):
            self.wait(lambda: self.healthy() or bool(self._port_taken()), 60, "a coordinator to lead")
            if not (taken := self._port_taken()):
                break
            for index in taken:
                self.ports[index] = free_port()
            self._urls()
            for index in taken:
                self.start_coordinator(index, wait=False)
        self.wait(self.healthy, 60, "a coordinator to lead")

    def _port_taken(self) -> list[int]:
        """The coordinators that ended because their port was in use."""
        taken = []
        for index, process in self.coordinators.items():
            log = self.root / "logs" / ("coordinator.log" if index == 0 else f"coordinator-{index}.log")
            if process.poll() is not None and "address already in use" in log.read_text(errors="replace"):
                taken.append(index)
        return taken

    def start_coordinator(self, index: int = 0, wait: bool = True) -> None:
        extra: list[str] = []
        if self.settings:
            path = self.root / "settings.yaml"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(f"{k}: {v}\n" for k, v in self.settings.items()))
            extra = ["--settings", str(path)]
        if self.cluster is not None:
            extra += ["--cluster", str(self.cluster)]
        if self.tls is not None:
            extra += ["--tls-cert", str(self.tls.cert), "--tls-key", str(self.tls.key)]
        if self.hosts is not None or index > 0:
            extra += ["--host", self.addresses[index], "--advertise", self.addresses[index]]
        if self.store is not None:
            extra += ["--store", self.store]
        self.coordinators[index] = self._spawn(
            [
                "coordinator",
                "--port",
                str(self.ports[index]),
                "--state-dir",
                str(self.root / "coordinator"),
                "--checkpoint-dir",
                str(self.root / "checkpoints"),
                *extra,
            ],
            self.root / "logs" / ("coordinator.log" if index == 0 else f"coordinator-{index}.log"),
        )
        if wait:
            self.wait(self.healthy, 60, "the coordinator to listen")

    def healthy(self) -> bool:
        try:
            return bool(self.request("GET", "/health").status_code == 200)
        except httpx.HTTPError:
            return False

    def kill_coordinator(self, index: int = 0) -> None:
        if (process := self.coordinators.pop(index, None)) is not None:
            _kill_group(process, signal.SIGKILL)

    def start_agent(self, name: str) -> None:
        self.agents[name] = self._spawn(
            [
                "agent",
                "--coordinator",
                self.url,
                "--slots",
                str(self.slots),
                "--node",
                name,
                "--run-dir",
                str(self.root / "agents" / name),
                "--token-file",
                str(self.token_file(Role.AGENT, name)),
                *(["--ca", str(self.tls.ca)] if self.tls else []),
                *(["--address", self.host_of[name].address] if self.hosts is not None else []),
                *(["--metrics-port", str(self.agent_metrics[name])] if name in self.agent_metrics else []),
                *(["--gpus", ",".join(self.gpus)] if self.gpus else []),
                *(["--domain", self.domains[name]] if name in self.domains else []),
                *([] if self.warm_start else ["--cold-start"]),
                *(["--fork-template", str(t.socket)] if (t := self._template()) is not None else []),
            ],
            self.root / "logs" / f"agent-{name}.log",
            name if self.hosts is not None else None,
        )

    def _template(self) -> Template | None:
        """The template its agents fork their servers from (``TEMPLATES``); None for agents that
        start workers as new interpreters."""
        return shared_template() if self.warm_start else None

    def cut_link(self, name: str) -> None:
        """Cut ``name``'s network link (test hosts only): its processes run on, unreachable."""
        assert self.hosts is not None, "links exist between test hosts: pass hosts=TestHosts(...)"
        self.hosts.cut(self.host_of[name])

    def heal_link(self, name: str) -> None:
        assert self.hosts is not None, "links exist between test hosts: pass hosts=TestHosts(...)"
        self.hosts.heal(self.host_of[name])

    def _signal_node(self, name: str, sig: int) -> tuple[Started, list[int]]:
        """Send ``sig`` to a node's agent and to each of its live workers' process groups (only
        live ones: an ended worker's pid may since belong to an unrelated process)."""
        agent = self.agents.pop(name)
        alive = {phase.value for phase in SLOT_HOLDING_PHASES}
        workers = self.get("/v1/workers")
        pids = [w["pid"] for w in workers if w["node"] == name and w["pid"] and w["state"] in alive]
        _kill_group(agent, sig)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, sig)
        return agent, pids

    def kill_node(self, name: str) -> None:
        """Lose a node: its agent dies at once, and its workers with it."""
        self._signal_node(name, signal.SIGKILL)

    def freeze_node(self, name: str) -> None:
        """Lose a node silently: its agent and workers stop (SIGSTOP) with their connections
        open, as when a machine loses power or its network: peers get no error, only silence.
        They are killed when the cluster closes."""
        self.frozen.append(self._signal_node(name, signal.SIGSTOP))

    def reboot_frozen(self, within_s: float = 30.0) -> None:
        """The frozen machines are rebooted: their stopped processes die (a test host cannot thaw
        processes whose node was declared lost without fencing, issue 15). Raises RuntimeError,
        with what the kernel says of it, for an agent not reaped ``within_s`` after its SIGKILL."""
        frozen, self.frozen = self.frozen, []
        for agent, pids in frozen:
            _kill_group(agent, signal.SIGKILL)
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
        deadline = time.time() + within_s
        for agent, _ in frozen:
            try:
                agent.wait(max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                raise RuntimeError(
                    f"the frozen agent {agent.pid} was not reaped {within_s:.0f} s after its SIGKILL: "
                    f"{_process_state(agent.pid)}"
                ) from None

    def kill_worker(self, task: str, rank: int, sig: int = signal.SIGKILL) -> int:
        worker = next(
            w
            for w in self.get("/v1/workers")
            if w["task"] == task and w["rank"] == rank and w["state"] == "running"
        )
        os.kill(worker["pid"], sig)
        return int(worker["pid"])

    def close(self) -> None:
        for agent in list(self.agents.values()):
            _kill_group(agent, signal.SIGTERM)
        deadline = time.time() + 10
        for agent in self.agents.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                agent.wait(max(0.1, deadline - time.time()))
            _kill_group(agent, signal.SIGKILL)
        self.agents.clear()
        with contextlib.suppress(RuntimeError):  # (said by the harness that froze them, not here)
            self.reboot_frozen()
        for index in list(self.coordinators):
            self.kill_coordinator(index)
        with contextlib.suppress(Exception):  # the host's thread may be gone with its harness
            self._here(self.client.close)
        self._free_memory_tier()

    def _free_memory_tier(self) -> None:
        """The embedded cluster is gone: the nodes' in-memory copies of tasks that had not ended
        go with it (an agent that stops keeps them for its next start; these nodes have none)."""
        for folder in (self.root / "checkpoints").glob("*"):
            for node in self.node_names:
                path = host_checkpoint_dir(folder, node)
                shutil.rmtree(path, ignore_errors=True)
                with contextlib.suppress(OSError):
                    path.parent.rmdir()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ the API
    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """A request to the coordinator that leads: the one reached last, else the next that
        accepts the connection (standbys keep their ports closed)."""
        for attempt in range(len(self.urls)):
            index = (self.leading + attempt) % len(self.urls)
            try:
                response: httpx.Response = self._here(
                    self.client.request, method, self.urls[index] + path, **kwargs
                )
            except (httpx.ConnectError, httpx.ConnectTimeout):
                if attempt + 1 == len(self.urls):
                    raise
                continue
            self.leading = index
            return response
        raise AssertionError("unreachable")

    def get(self, path: str, **params: Any) -> Any:
        response = self.request("GET", path, params=params)
        response.raise_for_status()
        return response.json()

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("POST", path, **kwargs)

    def submit(self, spec_yaml: str) -> list[dict[str, Any]]:
        response = self.post(
            "/v1/tasks", content=spec_yaml.encode(), headers={"content-type": "application/yaml"}
        )
        if response.status_code != 201:
            raise UnicronError(response.text)
        result: list[dict[str, Any]] = response.json()
        return result

    def task(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self.get(f"/v1/tasks/{name}")
        return result

    def wait(self, predicate: Callable[[], bool], timeout: float, what: str, poll: float = 0.2) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if predicate():
                    return
            time.sleep(poll)
        raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}{self._ended()}")

    def _ended(self) -> str:
        """Which of the cluster's own processes have ended, and how (a coordinator that vanished
        left a test waiting on events that never came, with nothing said of why)."""
        processes = {f"coordinator {i}": p for i, p in self.coordinators.items()}
        processes |= {f"agent {name}": p for name, p in self.agents.items()}
        ended = [f"{who} ({_status(code)})" for who, p in processes.items() if (code := p.poll()) is not None]
        return f"; ended meanwhile: {', '.join(ended)}" if ended else ""


def _status(code: int) -> str:
    """A process's exit code as said: a signal by its name (Popen's -N)."""
    if code >= 0:
        return f"exit code {code}"
    with contextlib.suppress(ValueError):
        return f"killed by {signal.Signals(-code).name}"
    return f"killed by signal {-code}"


def _process_state(pid: int) -> str:
    """What /proc says of ``pid`` (its state, parent and process group), for an error message."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        group = os.getpgid(pid)
    except (FileNotFoundError, ProcessLookupError):
        return "the kernel has no such process (reaped by another parent?)"
    wanted = ("State:", "PPid:", "SigPnd:", "ShdPnd:")
    return "; ".join(line for line in status.splitlines() if line.startswith(wanted)) + f"; group {group}"


def _kill_group(process: Started, sig: int) -> None:
    """Signal the process's group, only while the process is not yet reaped (``poll``): a reaped
    leader's id is free, and may since lead another process group, another test's included."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:  # a forked one before its setsid: in no group of its own yet
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, sig)
        except PermissionError:
            pass
    if sig == signal.SIGKILL:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(5)

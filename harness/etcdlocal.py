"""A real etcd on loopback (one member, or a cluster of three) for the tests and the benchmarks:
the ``etcd`` binary that ``make test`` installs from Debian (``etcd-server``), each member on free
ports with its data under a directory of its own.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from unicron.control.agent.processes import dies_with_parent
from unicron.control.private import private_log

MAX_TXN_OPS = 10_000  # a launch of many workers is one transaction (etcd's default is 128)


def etcd_binary() -> str | None:
    return shutil.which("etcd")


START_TRIES = 3  # a port found free may be taken before etcd binds it: new ports, again


def _free_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports free now (each held until all are chosen: two chosen
    one after the other could be the same)."""
    with contextlib.ExitStack() as held:
        sockets = [held.enter_context(socket.socket()) for _ in range(count)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in sockets]


@dataclass
class Member:
    name: str
    client_port: int
    peer_port: int
    data: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"


@dataclass
class EtcdCluster:
    root: Path
    size: int = 1
    members: list[Member] = field(default_factory=list)

    def start(self, timeout_s: float = 30.0) -> EtcdCluster:
        binary = etcd_binary()
        if binary is None:
            raise RuntimeError("etcd is not installed: `make test` installs it (Debian's etcd-server)")
        for attempt in range(1, START_TRIES + 1):
            ports = _free_ports(2 * self.size)
            self.members = [
                Member(f"m{i}", ports[2 * i], ports[2 * i + 1], self.root / f"m{i}") for i in range(self.size)
            ]
            cluster = ",".join(f"{m.name}=http://127.0.0.1:{m.peer_port}" for m in self.members)
            for m in self.members:
                if attempt > 1:
                    shutil.rmtree(m.data, ignore_errors=True)  # the failed try's half-made member
                self._launch(binary, m, cluster)
            try:
                self.wait_healthy(timeout_s)
                return self
            except RuntimeError as failed:
                self.close()
                if "address already in use" not in str(failed) or attempt == START_TRIES:
                    raise
        return self

    def _launch(self, binary: str, m: Member, cluster: str, state: str = "new") -> None:
        m.data.mkdir(parents=True, exist_ok=True)
        client, peer = f"http://127.0.0.1:{m.client_port}", f"http://127.0.0.1:{m.peer_port}"
        argv = [
            binary, "--name", m.name, "--data-dir", str(m.data / "data"),
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", cluster, "--initial-cluster-state", state,
            "--initial-cluster-token", f"unicron-{self.root.name}",
            "--max-txn-ops", str(MAX_TXN_OPS), "--logger", "zap", "--log-level", "warn",
        ]  # fmt: skip
        log = private_log(m.data / "etcd.log")  # the process holds it
        dies = dies_with_parent(signal.SIGKILL)
        m.process = subprocess.Popen(argv, stdout=log, stderr=log, preexec_fn=dies)

    def wait_healthy(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        for m in self.members:
            if m.process is None:
                continue
            while True:
                try:
                    if httpx.get(f"http://{m.endpoint}/health", timeout=1.0).json().get("health") == "true":
                        break
                except (httpx.HTTPError, ValueError):
                    pass
                if m.process.poll() is not None or time.monotonic() > deadline:
                    log = (m.data / "etcd.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"etcd member {m.name} did not become healthy:\n{log}")
                time.sleep(0.1)

    @property
    def url(self) -> str:
        return "etcd://" + ",".join(m.endpoint for m in self.members)

    def stop_member(self, index: int) -> None:
        m = self.members[index]
        if m.process is not None and m.process.poll() is None:
            m.process.kill()
            m.process.wait()
        m.process = None

    def close(self) -> None:
        for i in range(len(self.members)):
            self.stop_member(i)

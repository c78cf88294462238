"""Test hosts: Linux network namespaces that stand for the machines of a cluster, on one machine.

Each host is a network namespace with one interface (``eth0``) and an address of its own on
``SUBNET``, joined by a veth pair to a bridge that lives in a namespace of its own, as machines
are joined to a switch. Everything else (processes, files, the checkpoint folder) is shared, as a
cluster shares its storage. A host's link is cut by setting its bridge port down: its connections
then time out, as on a real partition (nothing answers, nothing refuses). ``unicron demo
--hosts`` runs on them; the other network faults (partitions between groups of hosts, loss,
stalls, delay) are the checkout's test harness (``harness/netfaults.py``).

Safety. Traffic must go only between the namespaces made here, to the addresses assigned here:

- no host has a default route, and the bridge's namespace has no link to the machine's own
  namespace, so no packet leaves the harness's namespaces;
- the machine's own namespace does have a default route (to the outside), so nothing here ever
  connects from it to a test address: every party, the test's own HTTP client included, runs
  inside a host (a process under ``ip netns exec``, or a thread that entered the namespace:
  ``InNamespace``, which checks it did before any socket is made).

Every namespace is named ``unicron-<pid>-<host>`` after the process that made it; ``close``
removes them (``with TestHosts(...)`` and interpreter exit do it), and a later harness removes
those whose maker died without closing (a killed test run).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import signal
import subprocess
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

from unicron.control.agent.template import enter_network

SUBNET = "10.231.0"  # a /24 that exists only inside the harness's namespaces
PREFIX = "unicron-"
NETNS_DIR = Path("/var/run/netns")
INTERFACE = "eth0"  # each host's one interface (a name of its own namespace)
T = TypeVar("T")


class HostsUnavailable(RuntimeError):
    """Network namespaces cannot be made here (not root, no ``ip``, or the kernel refuses)."""


@dataclass(frozen=True)
class Host:
    """One test host: its name in the harness, its namespace, its address and interface."""

    name: str
    namespace: str
    address: str
    port: str  # its veth end on the bridge (in the bridge's namespace)
    interface: str = INTERFACE


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """`ip ARGS` (iproute2), its failure a HostsUnavailable unless ``check`` is off."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise HostsUnavailable(f"`ip {' '.join(args)}` failed: {done.stderr.strip()}")
    return done


def unavailable() -> str | None:
    """Why test hosts cannot be made here (None: they can), checked by making one namespace."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "`ip` (iproute2) is not installed"
    probe = f"{PREFIX}{os.getpid()}-probe"
    done = ip("netns", "add", probe, check=False)
    if done.returncode != 0:
        return f"`ip netns add` failed: {done.stderr.strip()}"
    ip("netns", "del", probe, check=False)
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_leftovers() -> list[str]:
    """Remove the namespaces of harnesses whose process died without closing them."""
    removed = []
    for path in NETNS_DIR.glob(f"{PREFIX}*") if NETNS_DIR.exists() else []:
        match = re.fullmatch(rf"{PREFIX}(\d+)-.+", path.name)
        if match and not _alive(int(match.group(1))):
            _remove_namespace(path.name)
            removed.append(path.name)
    return removed


def _remove_namespace(namespace: str) -> None:
    """Kill what still runs inside it (a namespace lives as long as a process in it), then delete."""
    pids = ip("netns", "pids", namespace, check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    ip("netns", "del", namespace, check=False)


class TestHosts:
    """``count`` hosts named h0, h1, ... on one bridge; ``with TestHosts(3) as hosts:``."""

    __test__ = False  # not a pytest test class, despite its name

    def __init__(self, count: int) -> None:
        if not 1 <= count <= 200:
            raise ValueError(f"count={count}: between 1 and 200 test hosts")
        tag = f"{PREFIX}{os.getpid()}-{id(self) % 10_000}"
        self.bridge = f"{tag}-switch"
        self.hosts = [Host(f"h{i}", f"{tag}-h{i}", f"{SUBNET}.{10 + i}", f"p{i}") for i in range(count)]
        self._made: list[str] = []
        self._clients: dict[str, InNamespace] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ life
    def create(self) -> Self:
        reason = unavailable()
        if reason is not None:
            raise HostsUnavailable(reason)
        remove_leftovers()
        atexit.register(self.close)
        try:
            self._add_namespace(self.bridge)
            ip("-n", self.bridge, "link", "add", "br0", "type", "bridge")
            ip("-n", self.bridge, "link", "set", "br0", "up")
            for host in self.hosts:
                self._add_host(host)
        except BaseException:
            self.close()
            raise
        return self

    def _add_namespace(self, namespace: str) -> None:
        ip("netns", "add", namespace)
        self._made.append(namespace)
        ip("-n", namespace, "link", "set", "lo", "up")

    def _add_host(self, host: Host) -> None:
        self._add_namespace(host.namespace)
        # Both ends made straight into their namespaces: no name is ever taken in the machine's.
        ip(
            "link", "add", host.interface, "netns", host.namespace, "type", "veth",
            "peer", "name", host.port, "netns", self.bridge,
        )  # fmt: skip
        ip("-n", self.bridge, "link", "set", host.port, "master", "br0")
        ip("-n", self.bridge, "link", "set", host.port, "up")
        ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", host.interface)
        ip("-n", host.namespace, "link", "set", host.interface, "up")

    def close(self) -> None:
        with self._lock:
            for client in self._clients.values():
                client.close()
            self._clients.clear()
            for namespace in reversed(self._made):
                _remove_namespace(namespace)
            self._made.clear()

    def __enter__(self) -> Self:
        return self.create()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ use
    def __getitem__(self, name: str) -> Host:
        for host in self.hosts:
            if host.name == name:
                return host
        raise KeyError(f"no test host {name!r}: the hosts are {[h.name for h in self.hosts]}")

    def command(self, host: Host, argv: list[str]) -> list[str]:
        """``argv`` run on ``host`` (its network namespace; everything else is shared)."""
        return ["ip", "netns", "exec", host.namespace, *argv]

    def client(self, host: Host) -> InNamespace:
        """A thread inside ``host`` for this process's own connections (the test's HTTP client)."""
        with self._lock:
            if host.name not in self._clients:
                self._clients[host.name] = InNamespace(host.namespace)
            return self._clients[host.name]

    # ------------------------------------------------------------------ the link
    def cut(self, host: Host) -> None:
        """Cut ``host``'s link: its bridge port goes down, and every packet to or from it is lost
        (connections time out; nothing is refused)."""
        ip("-n", self.bridge, "link", "set", host.port, "down")

    def heal(self, host: Host) -> None:
        ip("-n", self.bridge, "link", "set", host.port, "up")


def _enter(namespace: str) -> str:
    """Move the calling thread (only it) into ``namespace``'s network; refuse to go on outside it.
    Returns the namespace's identity (``/proc/thread-self/ns/net``)."""
    before = os.readlink("/proc/thread-self/ns/net")
    enter_network(NETNS_DIR / namespace)
    if os.readlink("/proc/thread-self/ns/net") == before:
        raise RuntimeError(f"still outside {namespace} after setns: refusing to connect from here")
    return os.readlink("/proc/thread-self/ns/net")


class InNamespace:
    """One thread that lives inside a host's network namespace; ``call(fn, ...)`` runs ``fn``
    there, so that the sockets it makes (an ``httpx.Client``'s connections) belong to that host.
    A socket keeps the namespace it was made in, so objects holding sockets must be used only
    through ``call``."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"netns-{namespace}")
        self._inside = self._pool.submit(_enter, namespace).result(30)

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return self._pool.submit(self._checked, fn, args, kwargs).result()

    def _checked(self, fn: Callable[..., T], args: Any, kwargs: Any) -> T:
        if os.readlink("/proc/thread-self/ns/net") != self._inside:  # never from another network
            raise RuntimeError(f"the thread for {self.namespace} is not inside it: refusing to run")
        return fn(*args, **kwargs)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

"""A template server: one import of torch for all the agents a local cluster runs on one machine.

Each agent forks its Python workers from fork servers of its own (``forkserver.py``), each of
which imports torch once: about 3 s of CPU here, paid once per node and worker environment. On a
real cluster that is once per machine. A local cluster (``LocalCluster``, ``make demo``, the
tests) runs all its agents on one machine, so each agent would import torch again: in the test
suite, 156 servers used 426 s of CPU, a quarter of the whole (process accounting, 2026-12-06).

The template is a process that imports torch's modules (``warmstart.PRELOAD``) once and forks
the agents' fork servers from itself. An agent started with ``--fork-template`` asks it for each
server it would start. The template forks a child, which becomes that server:

- a session of its own, the agent's log for its output, the agent's pipes for orders and answers;
- the worker environment the agent gives it, and the task's own modules (``run.preload``)
  imported;
- then it serves the agent as a server the agent started itself would (``forkserver.Server``).

It ends as soon as the agent ends (it watches the agent's pidfd, where a server the agent
started has a parent-death signal); its workers die with it by theirs.

A server shares its agent's network: where the agent runs in a network namespace of its own (a
test host: ``control/launch/testhosts.py``), the forked server enters it before it imports or
forks anything, so its workers' connections are the host's. Entering another process's network
namespace takes the privilege that made it: a template not run as root refuses such an agent.

The template imported torch under its own environment, and modules read some variables once,
when imported. So it serves only a server whose environment is its own, except for Unicron's
own variables (``UNICRON_*``), which only Unicron's training library reads, and the template
never imports that. Otherwise it refuses, naming the variables that differ, and the agent starts
its server as a new interpreter. One template serves every cluster a process starts, and ends
with that process.

Protocol: a Unix socket (SOCK_SEQPACKET) in a folder only its user may enter. Only a process of
the template's user is served: the kernel's credentials of the caller are checked, and the
agent is the caller. The agent sends one message, ``{"env", "preload"}``, with three
descriptors: the read end of the server's orders, the write end of its answers, and its log.
The answer is ``{"pid"}`` or ``{"refused"}``. The template binds its socket before it imports
anything, so a request made meanwhile waits in the socket's backlog, not in an error.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import selectors
import socket
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from unicron.control.agent import forkserver

OWN_PREFIX = "UNICRON_"  # variables the template may differ in: read by Unicron's library alone
MAX_REQUEST = 1 << 20  # bytes: an environment and a list of modules
SOCKET_NAME = "template.sock"
BACKLOG = 64  # requests queued while the template imports (a cluster's agents, at most one each)
START_WAIT_S = 30.0  # for the template's socket to exist (it binds before importing anything)
CLONE_NEWNET = 0x40000000  # setns(2): the namespace entered is a network namespace


@dataclass(frozen=True)
class Request:
    """One server asked for: its environment, the modules it imports, and the agent's pipes."""

    env: dict[str, str]
    preload: list[str]
    orders: int  # the read end of the server's orders
    answers: int  # the write end of its answers
    log: int
    agent: int  # the caller's pid (the kernel's word, not the message's)


def differing(env: dict[str, str], own: dict[str, str], ignored: frozenset[str] = frozenset()) -> list[str]:
    """The variables in which ``env`` differs from the template's ``own``, except Unicron's own
    and those its starter said no import reads (``ignored``)."""
    keys = {k for k in (*env, *own) if not k.startswith(OWN_PREFIX) and k not in ignored}
    return sorted(k for k in keys if env.get(k) != own.get(k))


def network_of(pid: int) -> str:
    """The network namespace process ``pid`` runs in (``net:[inode]``)."""
    return os.readlink(f"/proc/{pid}/ns/net")


def enter_network(namespace: str | Path) -> None:
    """Move the calling thread into the network namespace at ``namespace`` (``/proc/PID/ns/net``,
    or a named namespace's file): a single-threaded process, such as a fork server, moves whole."""
    fd = os.open(namespace, os.O_RDONLY)
    try:
        if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"could not enter the network namespace {namespace}: {os.strerror(errno)}")
    finally:
        os.close(fd)


def read_request(conn: socket.socket) -> Request | str:
    """The request on ``conn``, or why it is refused (descriptors received are then closed)."""
    message, fds, _, _ = socket.recv_fds(conn, MAX_REQUEST, 3)
    pid, uid, _ = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    refusal = None
    if uid != os.getuid():
        refusal = "the caller is not the template's user"
    elif len(fds) != 3:
        refusal = f"a request carries 3 descriptors (orders, answers, log), not {len(fds)}"
    if refusal is None:
        try:
            raw = json.loads(message)
            env, preload = dict(raw["env"]), list(raw["preload"])
        except (ValueError, KeyError, TypeError) as exc:
            refusal = f"an unreadable request: {exc}"
    if refusal is not None:
        for fd in fds:
            os.close(fd)
        return refusal
    orders, answers, log = fds
    return Request(
        {str(k): str(v) for k, v in env.items()}, [str(m) for m in preload], orders, answers, log, pid
    )


def serve_agents(
    listener: socket.socket, starter: int, own: dict[str, str], ignored: frozenset[str]
) -> Request | None:
    """Answer requests until the process that started the template ends (None). In a forked
    child, the request it is to serve. ``own``: the environment the template imported under
    (the imports may add to it, as torch's inductor adds its cache's folder). The template
    reaps the servers it forked, so that their CPU and their workers' counts as its children's,
    as a server's an agent started counts as the agent's."""
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(starter, selectors.EVENT_READ)
    servers: dict[int, int] = {}  # pidfd -> pid
    while True:
        for key, _ in selector.select():
            if key.fd == starter:
                return None
            if key.fd in servers:
                selector.unregister(key.fd)
                os.close(key.fd)
                os.waitpid(servers.pop(key.fd), 0)
                continue
            conn, _ = listener.accept()
            with conn, contextlib.suppress(OSError):  # (a caller gone mid-request: its own loss)
                request = checked(conn, own, ignored)
                if request is None:
                    continue
                pid = os.fork()
                if pid == 0:
                    selector.close()
                    listener.close()
                    for fd in (*servers, starter):
                        os.close(fd)
                    return request
                for fd in (request.orders, request.answers, request.log):
                    os.close(fd)
                pidfd = os.pidfd_open(pid)
                servers[pidfd] = pid
                selector.register(pidfd, selectors.EVENT_READ)
                conn.send(json.dumps({"pid": pid}).encode())  # (gone: its server sees it, and ends)


def checked(conn: socket.socket, own: dict[str, str], ignored: frozenset[str]) -> Request | None:
    """The request on ``conn`` if it is to be served; None where it was refused (and told why)."""
    request = read_request(conn)
    if isinstance(request, Request) and (why := unservable(request, own, ignored)):
        for fd in (request.orders, request.answers, request.log):
            os.close(fd)
        request = why
    if isinstance(request, str):
        conn.send(json.dumps({"refused": request}).encode())
        return None
    return request


def unservable(request: Request, own: dict[str, str], ignored: frozenset[str]) -> str | None:
    """Why the template cannot serve ``request`` (None: it can)."""
    if other := differing(request.env, own, ignored):
        return f"the environment differs from the template's in {', '.join(other)}"
    with contextlib.suppress(OSError):  # (the agent gone: its server ends at once)
        if network_of(request.agent) != network_of(os.getpid()) and os.geteuid() != 0:
            return (
                "the agent runs in a network namespace of its own, which only a template run as root enters"
            )
    return None


def become_server(request: Request) -> forkserver.Order | None:
    """In the forked child: serve the agent as its own server would, until it closes the orders
    and every worker is reaped (None); in a worker forked here, the order it is to become."""
    os.setsid()
    for target in (1, 2):
        os.dup2(request.log, target)
    os.close(request.log)
    try:
        agent = os.pidfd_open(request.agent)
        if network_of(request.agent) != network_of(os.getpid()):
            enter_network(f"/proc/{request.agent}/ns/net")
    except ProcessLookupError:
        os._exit(0)  # the agent is gone already
    except OSError as exc:  # (a namespace it may not enter: its workers start as new interpreters)
        print(f"fork server: {exc}; not serving", file=sys.stderr)
        forkserver.send(request.answers, {"ready": False, "missing": [], "why": str(exc)})
        os._exit(0)
    forkserver.retitle(f"{sys.executable} -m unicron.control.agent.forkserver (from a template)")
    os.environ.clear()
    os.environ.update(request.env)
    missing = forkserver.preload(request.preload)
    sys.stdout.flush()
    why = forkserver.unsafe_to_fork()
    if why is not None:
        print(f"fork server: {why}; not serving", file=sys.stderr)
        forkserver.send(request.answers, {"ready": False, "missing": missing, "why": why})
        os._exit(0)
    forkserver.send(request.answers, {"ready": True, "missing": missing})
    return forkserver.Server(request.orders, request.answers, watched=agent).serve()


def main() -> None:
    """``python -m unicron.control.agent.template --socket PATH --preload a,b [--ignore X,Y]``:
    bind, import, serve (``--ignore``: variables the agents' environments may differ in). Ends
    with the process that started it."""
    path, modules, ignored = _option("--socket"), _listed("--preload"), frozenset(_listed("--ignore"))
    starter = os.pidfd_open(os.getppid())
    # Its starter's environment, as its agents inherit it; run with -u as their servers are
    # (the supervisor sets the variable for each worker).
    own = {**os.environ, "PYTHONUNBUFFERED": "1"}
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(BACKLOG)
    missing = forkserver.preload(modules)
    why = forkserver.unsafe_to_fork()
    if why is not None:  # the waiting agents' requests fail: they start their own servers
        print(f"template: {why}; not serving", file=sys.stderr)
        return
    if missing:
        print(f"template: could not import {', '.join(missing)}", file=sys.stderr)
    request = serve_agents(listener, starter, own, ignored)
    if request is None:
        return
    server = os.getpid()
    order = become_server(request)
    if order is not None:
        forkserver.become(order, server)


def _option(name: str) -> str:
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else ""


def _listed(name: str) -> list[str]:
    return [item for item in _option(name).split(",") if item]


# ---------------------------------------------------------------------- the agent's side


def ask(path: Path, env: dict[str, str], preload: list[str], log: int, wait_s: float) -> tuple[int, int, int]:
    """Ask the template at ``path`` for a server (blocking, at most ``wait_s``): its pid, the
    write end of its orders and the read end of its answers. OSError if it refuses or is not
    there."""
    orders_read, orders = os.pipe()
    answers, answers_write = os.pipe()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as conn:
            conn.settimeout(wait_s)
            conn.connect(str(path))
            request = json.dumps({"env": env, "preload": preload}).encode()
            socket.send_fds(conn, [request], [orders_read, answers_write, log])
            reply = json.loads(conn.recv(1 << 16) or b"{}")
    except (OSError, ValueError) as exc:
        os.close(orders)
        os.close(answers)
        raise OSError(f"the template at {path} did not answer: {exc}") from exc
    finally:
        os.close(orders_read)
        os.close(answers_write)
    if "pid" not in reply:
        os.close(orders)
        os.close(answers)
        raise OSError(f"the template refused: {reply.get('refused', 'no answer')}")
    return int(reply["pid"]), orders, answers


# ---------------------------------------------------------------------- its starter's side


class Template:
    """A template process, started with this process's environment, as the agents it serves are
    (the C library's: GNU readline, which pytest imports, sets COLUMNS and LINES there, not in
    ``os.environ``); ended by ``close`` or with this process."""

    def __init__(self, preload: list[str], ignored: tuple[str, ...] = ()) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="unicron-template-"))  # (0700)
        self.socket = self.folder / SOCKET_NAME
        argv = [sys.executable, "-u", "-m", __name__, "--socket", str(self.socket)]
        argv += ["--preload", ",".join(preload), "--ignore", ",".join(ignored), *forkserver.TITLE_ROOM]
        with (self.folder / "template.log").open("ab") as log:
            self.process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,  # a Ctrl-C to the starter's group is the starter's to handle
            )
        deadline = time.monotonic() + START_WAIT_S
        while not self.socket.exists() and self.process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)

    @property
    def serving(self) -> bool:
        return self.process.poll() is None and self.socket.exists()

    def close(self) -> None:
        """End it (the servers it forked live on until their agents end) and remove its folder."""
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()
        self.process.wait()
        with contextlib.suppress(OSError):
            for child in self.folder.iterdir():
                child.unlink()
            self.folder.rmdir()


if __name__ == "__main__":
    main()

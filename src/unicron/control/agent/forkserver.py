"""A fork server: an interpreter that has imported torch once and forks each worker from itself.

A worker started as a new interpreter spends seconds importing torch, torch.distributed, its
checkpoint modules and dynamo (which the first optimizer step imports) before it runs a line of
training: about 3.5 s of CPU per worker on a 2-core node, paid again by every process a recovery
starts. The agent runs one server per worker environment (``warmstart.py``); the server imports
those modules, then waits for orders. For each it forks a child that becomes the worker: a
session of its own, a parent-death signal, the log as stdout and stderr, the worker's directory
and environment, then the program run as ``__main__`` (``runpy``), as ``python script.py`` or
``python -m module`` runs it. This is Android's zygote and ``multiprocessing``'s forkserver with
preloading.

Only the standard library and setproctitle are imported here before the preload; the server
starts no thread of its own, and serves only if the preload left CUDA uninitialised and started no
Python thread, so forking it is as safe as a DataLoader's forked workers. Nothing of Unicron's training
library is preloaded: it installs guards when imported (``train/porting.py``), which a program
that never imports it must not meet. The server reaps its children (a pidfd each, no SIGCHLD
handler) and reports every exit to the agent; the agent signals the workers by pid and process
group as it does the others. The server dies with the agent (parent-death signal; one a local
cluster's template forked, ``template.py``, watches the agent's pidfd instead) and its workers
with it.

Protocol: JSON lines. The agent writes orders to the server's stdin
(``{"id", "argv", "env", "cwd", "log"}``); the server answers on its stdout, which it keeps for
that alone (what the preloaded modules print goes to its stderr): ``{"ready": ..., "missing":
..., "why": ...}`` once, then ``{"id", "pid"}`` or ``{"id", "error"}`` per order and ``{"exit":
pid, "code": ...}`` per exit (negative: the signal).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib
import json
import os
import runpy
import selectors
import signal
import sys
import threading
from dataclasses import dataclass
from typing import Any

import setproctitle

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
# Room in a server's command line for the commands of the processes forked from it (``retitle``):
# the arguments that end the command of a server, and of a template that forks servers.
TITLE_ROOM = ["--title-room", " " * 2048]


@dataclass(frozen=True)
class Order:
    """One worker to become: ``argv`` is ``[python, script, ...]`` or ``[python, -m, module, ...]``."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    log: str


def preload(modules: list[str]) -> list[str]:
    """Import the modules; the names of those that could not be imported (the server still
    serves: a worker then imports them itself).

    Then every object there is so far is frozen out of the garbage collector's sight
    (``gc.freeze``, as Python's docs advise before forking): a collection in a forked child
    would otherwise walk torch's hundreds of thousands of objects, writing to each one's header
    and so copying every page they lie on (a worker's first full collection took 0.2 s of CPU
    here, 0.016 s frozen), and would walk them again at each full collection while it trains."""
    missing = []
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # any failure is the worker's to meet, in its own log
            missing.append(name)
    gc.freeze()
    return missing


def send(channel: int, message: dict[str, Any]) -> None:
    os.write(channel, json.dumps(message).encode() + b"\n")


class Server:
    """The server's loop: orders in, forks and exits out."""

    def __init__(self, orders: int, channel: int, watched: int | None = None) -> None:
        self.orders, self.channel = orders, channel
        # A pidfd of the agent, for a server it did not start (``template.py``): where a started
        # server's parent-death signal would end it, this does, and its workers end by theirs.
        self.watched = watched
        self.selector = selectors.DefaultSelector()
        self.selector.register(orders, selectors.EVENT_READ)
        if watched is not None:
            self.selector.register(watched, selectors.EVENT_READ)
        self.children: dict[int, int] = {}  # pidfd -> pid
        self.pending = b""
        self.open = True

    def serve(self) -> Order | None:
        """Serve until the agent closes the orders and every child is reaped. In a forked child
        this returns the order it is to become."""
        while self.open or self.children:
            for key, _ in self.selector.select():
                if key.fd == self.watched:
                    os._exit(1)  # the agent ended
                if key.fd == self.orders:
                    became = self._read_orders()
                    if became is not None:
                        return became
                else:
                    self._reap(key.fd)
        return None

    def _read_orders(self) -> Order | None:
        chunk = os.read(self.orders, 1 << 16)
        if not chunk:
            self.open = False
            self.selector.unregister(self.orders)
            return None
        self.pending += chunk
        while b"\n" in self.pending:
            line, self.pending = self.pending.split(b"\n", 1)
            raw = json.loads(line)
            order = Order(argv=raw["argv"], env=raw["env"], cwd=raw["cwd"], log=raw["log"])
            try:
                pid = os.fork()
            except OSError as exc:
                send(self.channel, {"id": raw["id"], "error": f"{type(exc).__name__}: {exc}"})
                continue
            if pid == 0:
                self._leave()
                return order
            pidfd = os.pidfd_open(pid)
            self.selector.register(pidfd, selectors.EVENT_READ)
            self.children[pidfd] = pid
            send(self.channel, {"id": raw["id"], "pid": pid})
        return None

    def _reap(self, pidfd: int) -> None:
        pid = self.children.pop(pidfd)
        self.selector.unregister(pidfd)
        os.close(pidfd)
        _, status = os.waitpid(pid, 0)
        send(self.channel, {"exit": pid, "code": os.waitstatus_to_exitcode(status)})

    def _leave(self) -> None:
        """In the child: drop the server's descriptors (a new interpreter has none of them)."""
        watched = [] if self.watched is None else [self.watched]
        for fd in [*self.children, self.orders, self.channel, *watched]:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.selector.close()


def become(order: Order, server: int) -> None:
    """Turn this forked child into the worker, then run its program as ``__main__``."""
    os.setsid()  # its own process group, as a new interpreter's start_new_session
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != server:  # the server died before the signal was armed
        os._exit(1)
    null = os.open(os.devnull, os.O_RDONLY)
    log = os.open(order.log, os.O_WRONLY | os.O_APPEND)  # (created private by the agent)
    for fd, target in ((null, 0), (log, 1), (log, 2)):
        os.dup2(fd, target)
    os.close(null)
    os.close(log)
    os.chdir(order.cwd)
    # ps and /proc/PID/cmdline show the worker's command (as one string), not the server's; the
    # short name (comm) stays the interpreter's, which setproctitle would overwrite.
    name = _short_name()
    retitle(" ".join(order.argv))
    libc.prctl(PR_SET_NAME, name)
    os.environ.clear()
    os.environ.update(order.env)
    fresh_random_state()
    if order.argv[1] == "-m":
        sys.argv = [order.argv[2], *order.argv[3:]]
        sys.path[0] = os.getcwd()
        runpy.run_module(order.argv[2], run_name="__main__", alter_sys=True)
        return
    script = order.argv[1]
    sys.argv = [script, *order.argv[2:]]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    if not os.path.exists(script):  # as the interpreter says it, with its exit status
        print(f"{sys.executable}: can't open file {os.path.abspath(script)!r}: No such file", file=sys.stderr)
        sys.exit(2)
    runpy.run_path(script, run_name="__main__")


def retitle(title: str) -> None:
    """Show ``title`` as this forked process's command (``ps``, /proc/PID/cmdline), within the
    memory of the command line it was forked with (``TITLE_ROOM``; a longer title is cut). The
    memory after it holds the initial environment, which /proc/PID/environ shows: setproctitle
    would write over it too, and the end-of-run check finds what a run left behind by the mark
    there (``bench/leftovers.py``): forked workers and servers were invisible to it. Before the
    environment changes (setproctitle reads its option from it)."""
    os.environ["SPT_NOENV"] = "1"
    setproctitle.setproctitle(title)


def _short_name() -> bytes:
    with open("/proc/self/comm", "rb") as comm:
        return comm.read().strip()


def fresh_random_state() -> None:
    """What a new process would have: Python's ``random`` is reseeded at fork by itself; torch's
    default generators and NumPy's global one, seeded from entropy when imported, would be the
    server's in every child (``torch.seed`` seeds CUDA's lazily, leaving CUDA uninitialised)."""
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.seed()


def unsafe_to_fork() -> str | None:
    """Why forking this process now would not give a worker what a new interpreter has (None:
    it is safe): CUDA initialised (a child cannot use it), or Python threads running (a child
    gets their locks as they were, held or not, and none of the threads). Native pools are the
    libraries' own: NumPy's OpenBLAS starts its thread server when imported and takes it down
    and back up around a fork (``pthread_atfork``); torch's OpenMP pool starts at the first
    parallel operation, which an import does not run."""
    torch = sys.modules.get("torch")
    if torch is not None and bool(torch.cuda.is_initialized()):
        return "the preloaded modules initialised CUDA"
    if threading.active_count() > 1:
        return "the preloaded modules started Python threads"
    return None


def main() -> None:
    channel = os.dup(1)  # the answers' own; anything else printed to stdout goes to stderr
    os.dup2(2, 1)
    modules = sys.argv[sys.argv.index("--preload") + 1].split(",") if "--preload" in sys.argv else []
    server_pid = os.getpid()
    missing = preload([m for m in modules if m])
    sys.stdout.flush()
    why = unsafe_to_fork()
    if why is not None:  # the agent starts this environment's workers as new interpreters
        print(f"fork server: {why}; not serving", file=sys.stderr)
        send(channel, {"ready": False, "missing": missing, "why": why})
        return
    send(channel, {"ready": True, "missing": missing})
    order = Server(sys.stdin.fileno(), channel).serve()
    if order is not None:
        become(order, server_pid)


if __name__ == "__main__":
    main()

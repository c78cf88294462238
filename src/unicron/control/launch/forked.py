"""A local cluster's own processes, forked from a server that imported their modules once.

A local cluster (``LocalCluster``: ``make demo``, the end-to-end tests) runs its coordinators and
agents as ``python -m unicron.cli.main ...`` on one machine. Each new interpreter imported the
same modules again: a coordinator torch (the task stores it hosts are torch's TCPStore,
``control/act/rendezvous.py``) and the service, about 2.5 s of CPU here; an agent its own modules,
about 0.5 s. In the test suite its 57 coordinators and 105 agents used 290 s of CPU, a sixth of
the suite's (sampled from /proc, 2026-12-07).

So they are forked from the standard library's fork server (``multiprocessing``'s ``forkserver``
start method), which imports ``PRELOAD`` once for all the processes this one starts. A forked
process is as the new interpreter would be: a session of its own (its process group is
signalled), its log for its output, no input, the environment a new process would inherit and
the starter's working folder as they are at its start, fresh random state, its command line for
``ps``, and the command-line interface's entry point run. Its exit status is the one the
interpreter would give (a signal as ``-N``, ``SystemExit``'s code, 1 for an exception): the fork
server reports it.

As with any program that starts processes through ``multiprocessing``, a program that starts a
local cluster runs its own code under ``if __name__ == "__main__":``: each forked process imports
the starter's main script (as ``__mp_main__``) before it runs, and one that starts a cluster at
import fails (exit 1, its error on the starter's output). Unicron's commands and benchmarks do.

The fork server is one per starting process and is shared with whatever else there forks from it
(the tests' ranks, ``tests/spawned.py``): the modules it imports are those asked for by the
first to start it. What it imports reads no variable a forked process could need changed: the
modules Unicron's own processes run read their settings when they run, not when imported.
"""

from __future__ import annotations

import ctypes
import importlib
import itertools
import multiprocessing as mp
import os
import subprocess
import sys
from collections.abc import Sequence
from multiprocessing.context import ForkServerContext
from pathlib import Path
from typing import Protocol

from unicron.control.agent.forkserver import fresh_random_state, retitle

MAIN = "unicron.cli.main"
# What a coordinator and an agent import before they serve (torch's store and the service; the
# agent's loop), about 2.5 s of CPU once here instead of 0.6-3.5 s in each process.
PRELOAD = (
    "torch.distributed",
    "unicron.cli.main",
    "unicron.cli.live",
    "unicron.control.service.service",
    "unicron.control.agent.agent",
)


class Started(Protocol):
    """What a local cluster asks of a process it started (``subprocess.Popen``'s, or ``Forked``'s)."""

    @property
    def pid(self) -> int: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


def context(also: Sequence[str] = ()) -> ForkServerContext:
    """The fork server's context, importing ``PRELOAD`` and ``also`` when it first starts."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([*PRELOAD, *also])
    return ctx


class Forked:
    """``python -m unicron.cli.main *args`` forked from the fork server, its output appended to
    ``log`` (which exists)."""

    def __init__(self, args: Sequence[str], log: Path) -> None:
        self.args = [sys.executable, "-m", MAIN, *args]
        self._process = context().Process(
            target=_run, args=(list(args), str(log), inherited_environment(), os.getcwd()), name=args[0]
        )
        self._process.start()

    @property
    def pid(self) -> int:
        pid = self._process.pid
        assert pid is not None  # (started in __init__)
        return pid

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        code = self._process.exitcode
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return code


def inherited_environment() -> dict[str, str]:
    """The environment a process started from this one inherits: the C library's, which holds
    what C code set beside ``os.environ`` (GNU readline, which pytest imports, sets ``COLUMNS`` and
    ``LINES``; the template the agents fork their servers from compares environments)."""
    entries = ctypes.POINTER(ctypes.c_char_p).in_dll(ctypes.CDLL(None), "environ")
    env: dict[str, str] = {}
    for i in itertools.count():
        entry = entries[i]
        if entry is None:
            return env
        name, _, value = os.fsdecode(entry).partition("=")
        env[name] = value
    raise AssertionError("unreachable")


def _run(args: list[str], log: str, env: dict[str, str], cwd: str) -> None:
    """In the forked process: become ``python -m unicron.cli.main *args`` started with ``env`` in
    ``cwd``, its output to ``log``."""
    os.setsid()
    out, null = os.open(log, os.O_WRONLY | os.O_APPEND), os.open(os.devnull, os.O_RDONLY)
    for fd, target in ((null, 0), (out, 1), (out, 2)):
        os.dup2(fd, target)
    os.close(out)
    os.close(null)
    # (within the server's own command line, long with its module search path: a longer one is cut)
    retitle(" ".join([sys.executable, "-m", MAIN, *args]))
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    fresh_random_state()
    module = importlib.import_module(MAIN)  # (preloaded: run as ``python -m`` runs it, not again)
    sys.argv = [module.__file__ or MAIN, *args]
    module.main()

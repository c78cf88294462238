"""A worker process as its agent sees it: its order, log, stack dumps and position board;
whether it is stopped, and the stack of one that is."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import shutil
import sys
import time
from asyncio.subprocess import PIPE, STDOUT
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from unicron.core.limits import MAX_STACK_CHARS
from unicron.core.position import decode
from unicron.core.protocol import LOG_TAIL_CHARS, LOG_TAIL_LINES, LaunchWorker, Progress, WorkerState


class Supervised(Protocol):
    """A worker's process as the agent holds it: a new interpreter (``asyncio.subprocess.Process``)
    or forked by a fork server (``warmstart.Forked``)."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int: ...


@dataclass
class Worker:
    order: LaunchWorker
    process: Supervised
    log: Path
    started: float = field(default_factory=time.time)
    exited: bool = False
    stop_ordered: bool = False  # the coordinator asked for it to stop
    stepped: bool = False  # it reported a completed step (its output then tells less than its reports)
    last_position: Progress | None = None  # the latest read from its board

    @property
    def stack_file(self) -> Path:
        return self.log.with_suffix(".stacks")

    @property
    def board(self) -> Path:
        return self.log.with_suffix(".position")

    @property
    def progress(self) -> Progress | None:
        """Its latest position (core.position); a torn or missing record keeps the last one."""
        if not self.exited:
            with contextlib.suppress(OSError):
                self.last_position = decode(self.board.read_bytes(), self.process.pid) or self.last_position
        return self.last_position

    def state(self, exit_unsent: bool = False) -> WorkerState:
        return WorkerState(
            task=self.order.task,
            generation=self.order.generation,
            rank=self.order.rank,
            pid=self.process.pid,
            running=not self.exited,
            stopped=not self.exited and is_stopped(self.process.pid),
            returncode=self.process.returncode if self.exited else None,
            progress=self.progress,
            exit_unsent=exit_unsent,
        )


def log_tail(path: Path, lines: int = LOG_TAIL_LINES, chars: int = LOG_TAIL_CHARS) -> str:
    """The last ``lines`` lines of a worker's output file, at most ``chars`` characters (the
    end kept); empty when there is none. Reads only the file's end."""
    try:
        with path.open("rb") as out:
            size = out.seek(0, os.SEEK_END)
            start = max(0, size - 4 * chars)  # room for multi-byte characters
            out.seek(start)
            data = out.read()
    except OSError:
        return ""
    text = data.decode(errors="replace").rstrip()
    kept = text.splitlines()[1 if start and "\n" in text else 0 :]  # not a line cut at its start
    return "\n".join(kept[-lines:])[-chars:]


async def read_stack(pid: int, timeout_s: float = 10.0) -> str:
    """A stopped process's Python stack, read from its memory by py-spy (``--nonblocking``: the
    process is neither resumed nor paused further)."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    try:
        run = await asyncio.create_subprocess_exec(
            spy, "dump", "--pid", str(pid), "--nonblocking", stdout=PIPE, stderr=STDOUT
        )
    except OSError as exc:
        return f"(stopped; its stack could not be read: {exc})"
    try:
        out, _ = await asyncio.wait_for(run.communicate(), timeout_s)
    except TimeoutError:
        run.kill()
        await run.wait()
        return f"(stopped; py-spy gave no stack within {timeout_s:g} s)"
    return out.decode(errors="replace")[:MAX_STACK_CHARS]


def dies_with_parent(sig: int) -> Callable[[], None]:
    """A ``preexec_fn`` (it runs in the child between fork and exec): the child gets ``sig`` when
    the process that started it dies (PR_SET_PDEATHSIG), so nothing outlives its supervisor."""

    def arm() -> None:
        with contextlib.suppress(Exception):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, sig)

    return arm


def is_stopped(pid: int) -> bool:
    """Whether the process is stopped (SIGSTOP or traced): state T or t in /proc/PID/stat."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] in "Tt"

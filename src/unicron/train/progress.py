"""Where this worker is, told to its agent; and its Python stack, dumped when the agent asks.

A hang shows as a step that does not end. The peers of a hung rank wait inside a collective; the
hung rank is elsewhere: looping or sleeping in its forward pass, or stuck before the collective.
Each move (a micro-batch done, a collective entered) overwrites this worker's position on its
board, a one-record file mapped into memory that the agent reads at each heartbeat
(``core.position``), so the coordinator can name the rank that is not where the others wait. The
stack comes from faulthandler on SIGUSR1: it is written by the C signal handler, so it works while
the interpreter is busy in an endless Python loop or blocked in a C call; a stopped (SIGSTOP)
process cannot write it.
"""

from __future__ import annotations

import contextlib
import faulthandler
import mmap
import os
import signal
import time
from collections.abc import Callable
from typing import IO

from unicron.core.position import RECORD_SIZE, encode
from unicron.core.protocol import Phase

STACK_SIGNAL = signal.SIGUSR1


class ProgressReporter:
    """Writes this worker's position on its board; without an agent (no board) it writes nothing."""

    def __init__(self, board: str | None, stack_file: str | None, generation: Callable[[], int]) -> None:
        self.generation = generation
        self.pid = os.getpid()
        self._board: mmap.mmap | None = None
        self._stack_out: IO[str] | None = None
        if board:
            with contextlib.suppress(OSError, ValueError), open(board, "w+b") as f:
                f.truncate(RECORD_SIZE)
                self._board = mmap.mmap(f.fileno(), RECORD_SIZE)  # outlives the file object
        if stack_file:
            with contextlib.suppress(OSError, ValueError, RuntimeError):
                self._stack_out = open(stack_file, "a")  # noqa: SIM115 (kept open for the handler)
                faulthandler.register(STACK_SIGNAL, file=self._stack_out, all_threads=True)

    def at(self, step: int, phase: Phase, what: str = "", micro_batch: int = 0) -> None:
        if self._board is not None:
            self._board[:] = encode(self.generation(), step, phase, what, micro_batch, time.time())

    def close(self) -> None:
        if self._board is not None:
            self._board.close()
            self._board = None
        if self._stack_out is not None:
            with contextlib.suppress(Exception):
                faulthandler.unregister(STACK_SIGNAL)
            self._stack_out.close()
            self._stack_out = None

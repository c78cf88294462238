"""The worker's side of the local channel to its agent: JSON datagrams on a Unix socket."""

from __future__ import annotations

import contextlib
import socket
import time
import traceback

from pydantic import BaseModel

from unicron.core.classify import classify_exception
from unicron.core.protocol import ExceptionReport


def exception_report(exc: BaseException, task: str, generation: int, rank: int, step: int) -> ExceptionReport:
    """An exception as the agent is told of it: classified into the error taxonomy, with its
    message and the end of its traceback."""
    return ExceptionReport(
        task=task,
        generation=generation,
        rank=rank,
        step=step,
        error_type=type(exc).__name__,
        message=str(exc)[:2000],
        kind=classify_exception(exc).value,
        traceback="".join(traceback.format_exception(exc))[-4000:],
        time=time.time(),
    )


class ReportChannel:
    """Sends reports to the agent; without an agent (a standalone run) it sends nothing."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._sock: socket.socket | None = None
        if path:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)

    def send(self, report: BaseModel) -> None:
        if self._sock is None or self.path is None:
            return
        # A report must never break training: a full or vanished socket drops it.
        with contextlib.suppress(OSError):
            self._sock.sendto(report.model_dump_json().encode(), self.path)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

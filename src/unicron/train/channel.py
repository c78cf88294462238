"""The worker's side of the local channel to its agent: JSON datagrams on a Unix socket."""

from __future__ import annotations

import socket
import threading
import time
import traceback
from collections import deque

from pydantic import BaseModel

from unicron.core.classify import classify_exception
from unicron.core.limits import MAX_LABEL_CHARS
from unicron.core.protocol import ExceptionReport

SEND_TIMEOUT_S = 2.0  # a report sent at once is dropped if the agent takes none for this long
BATCH_S = 0.05  # how often queued step reports go out (the agent forwards them every 0.5 s)
FLUSH_TIMEOUT_S = 5.0  # what the worker waits, at most, for its queued reports to go out


def exception_report(exc: BaseException, task: str, generation: int, rank: int, step: int) -> ExceptionReport:
    """An exception as the agent is told of it: classified into the error taxonomy, with its
    message and the end of its traceback."""
    return ExceptionReport(
        task=task,
        generation=generation,
        rank=rank,
        step=step,
        error_type=type(exc).__name__[:MAX_LABEL_CHARS],
        message=str(exc)[:2000],
        kind=classify_exception(exc).value,
        traceback="".join(traceback.format_exception(exc))[-4000:],
        time=time.time(),
    )


class ReportChannel:
    """Sends reports to the agent; without an agent (a standalone run) it sends nothing.

    The agent's socket queues only a few datagrams (Linux: ``net.unix.max_dgram_qlen``, 10 by
    default), and a sender blocks while it is full: on a busy node, a step that reported its
    end synchronously waited for the agent to be scheduled (py-spy: 4-6% of a tinygpt worker's
    samples at 4 workers on 2 cores). So a step's report (``send_soon``) is queued, and a thread
    of the channel's own sends what is queued every ``BATCH_S`` (waking that thread at every
    step cost as much as the send did: py-spy found the step in ``Condition.notify``). Every
    other report (a fault about to strike, an exception before the process ends, a checkpoint)
    is sent at once, after the queued ones (``send``): the agent sees them in order, and what
    precedes a fault is in before it strikes."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._sock: socket.socket | None = None
        if path:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._sock.settimeout(SEND_TIMEOUT_S)
        self._queued: deque[BaseModel] = deque()  # written out by the thread, off the step
        self._unsent = 0  # queued, or being sent by the thread
        self._hurry = False  # someone waits for the queue to be sent (``flush``)
        self._changed = threading.Condition()
        self._sender: threading.Thread | None = None

    def send(self, report: BaseModel) -> None:
        """Send ``report`` now, after every report queued before it."""
        if self._sock is None:
            return
        self.flush()
        self._sendto(report.model_dump_json().encode())

    def send_soon(self, report: BaseModel) -> None:
        """Queue ``report`` for the channel's thread, which also writes it out as JSON: the caller
        neither waits for the agent nor serialises (py-spy: ~0.2% of a tinygpt step). The caller
        must not change ``report`` afterwards."""
        if self._sock is None:
            return
        with self._changed:
            self._queued.append(report)
            self._unsent += 1  # no notify: the thread looks every BATCH_S
            if self._sender is None:
                self._sender = threading.Thread(target=self._send_queued, name="unicron-reports", daemon=True)
                self._sender.start()

    def flush(self, timeout_s: float = FLUSH_TIMEOUT_S) -> None:
        """Wait until the queued reports are sent (or dropped), for at most ``timeout_s``."""
        with self._changed:
            self._hurry = True
            self._changed.notify_all()
            self._changed.wait_for(lambda: self._unsent == 0, timeout_s)
            self._hurry = False

    def _send_queued(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._hurry or self._sock is None, BATCH_S)
                if self._sock is None:
                    return
                batch = list(self._queued)
                self._queued.clear()
            for report in batch:
                self._sendto(report.model_dump_json().encode(), patient=True)
            with self._changed:
                self._unsent -= len(batch)
                self._changed.notify_all()

    def _sendto(self, data: bytes, patient: bool = False) -> None:
        """A report must never break training: a vanished socket drops it, and so does one
        still full after ``SEND_TIMEOUT_S``, unless the sender is ``patient`` (the channel's
        thread: it keeps trying while the channel is open, and nobody waits for it)."""
        while (sock := self._sock) is not None and self.path is not None:
            try:
                sock.sendto(data, self.path)
                return
            except TimeoutError:
                if not patient:
                    return
            except OSError:
                return

    def close(self) -> None:
        """Send what is queued (for a short while), then close."""
        self.flush()
        with self._changed:
            sock, self._sock = self._sock, None
            self._changed.notify_all()
        if sock is not None:
            sock.close()

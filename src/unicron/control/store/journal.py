"""The store's writes, made behind it in a thread of their own, in order, in batches.

The store decides every change in memory (``store.py``); a backend makes it durable. With etcd a
write is a network round trip and a disk sync on the etcd members (milliseconds); made on the
coordinator's event loop, a thousand agents registering at once stalled the loop for seconds and
the heartbeats it then could not read made nodes look lost. The journal takes the writes off the
loop: ``put`` queues one operation's rows and events (numbered) and returns at once; the writer
thread takes everything queued, packs whole operations into batches of at most ``MAX_OPS`` rows
(etcd refuses larger transactions by default) and writes each batch atomically. Order is kept:
one writer, first queued first written.

What must not run ahead of the store (write-ahead): anything that leaves the coordinator. A reply
that tells a user their task is queued, an order to an agent, a membership written into a task's
rendezvous store: each waits until what was queued before it is durable (``when_durable`` for the
event loop, ``durable_by`` for the poster of memberships, ``control/act/posting.py``; ``flush``
blocks). A heartbeat's answer to reports other than steps' waits too: the agent drops them once
answered, so a leader killed just after answering would otherwise lose an exit, an error or a
fault's record (a step's report is superseded by the next). A registration's or a plain
heartbeat's answer does not wait: lost with a leader that died, it is made again (the agent
registers anew).

How far behind the writes are (``behind_s``: how long the oldest change not yet durable has
waited) is what operators watch (``unicron_store_write_lag_seconds``); it is the coordinator's own
lag, not counted against a node's silence itself: every heartbeat is read at once (an answer
that carries orders or answers reports waits for them to be durable; an agent whose answer came
too late says so in its next heartbeat, and that wait counts as the coordinator's lag).

A write that fails is tried again until it works (etcd's leader changing, a member restarting),
except a fenced one (this coordinator no longer leads: ``on_fenced``, which exits), an event id
another writer took (the same: two coordinators write one store), or records that cannot be
made into rows (a fault of the code: the same, rather than every write after it waiting).
"""

from __future__ import annotations

import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from unicron.brain.records import EventRecord
from unicron.control.store.backend import Backend, Change, Fenced

MAX_OPS = 128  # etcd's default --max-txn-ops
RETRY_S = (0.05, 0.1, 0.2, 0.5, 1.0)  # between tries of a failed write (then each second)


@dataclass(frozen=True)
class Entry:
    """One store operation's writes (all of them or none), and its place in the queue."""

    seq: int
    changes: Sequence[Change]
    events: Sequence[EventRecord]

    @property
    def size(self) -> int:
        return len(self.changes) + len(self.events)


def batches(entries: Sequence[Entry], max_ops: int = MAX_OPS) -> list[list[Entry]]:
    """Consecutive entries packed into batches of at most ``max_ops`` writes, never splitting
    one (an entry larger than that is a batch of its own); pure."""
    out: list[list[Entry]] = []
    size = 0
    for entry in entries:
        if out and size + entry.size <= max_ops:
            out[-1].append(entry)
            size += entry.size
        else:
            out.append([entry])
            size = entry.size
    return out


class Journal:
    def __init__(self, backend: Backend, on_fenced: Callable[[Exception], None]) -> None:
        self.backend, self.on_fenced = backend, on_fenced
        self.queued = 0  # the last entry's number
        self.durable = 0  # every entry up to this one is written
        self.failing: str | None = None  # the last write's error while it is being retried
        self._queue: deque[Entry] = deque()
        self._changed = threading.Condition()
        self._callbacks: list[tuple[int, Callable[[], object]]] = []
        self._waiting: deque[tuple[int, float]] = deque()  # (entry, when queued) not yet durable
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="store-journal", daemon=True)
        self._thread.start()

    def put(self, changes: Sequence[Change], events: Sequence[EventRecord] = ()) -> int:
        """Queue one operation's writes; returns its number."""
        with self._changed:
            self.queued += 1
            self._queue.append(Entry(self.queued, changes, events))
            self._waiting.append((self.queued, time.monotonic()))
            self._changed.notify_all()
            return self.queued

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until everything queued so far is durable; False if ``timeout_s`` ran out."""
        with self._changed:
            target = self.queued
            return self._changed.wait_for(lambda: self.durable >= target, timeout_s)

    def durable_by(self, seq: int, timeout_s: float) -> bool:
        """Wait until entry ``seq`` and every one before it is durable; False if ``timeout_s``
        ran out first."""
        with self._changed:
            return self._changed.wait_for(lambda: self.durable >= seq, timeout_s)

    def behind_s(self, now: float | None = None) -> float:
        """How long the oldest change not yet durable has waited (``time.monotonic``); 0 when
        everything queued is written."""
        with self._changed:
            if not self._waiting:
                return 0.0
            return max(0.0, (time.monotonic() if now is None else now) - self._waiting[0][1])

    def when_durable(self, callback: Callable[[], object]) -> None:
        """Call ``callback`` (from the writer thread, or now) once everything queued so far is
        durable."""
        with self._changed:
            if self.durable >= self.queued:
                ready = True
            else:
                ready = False
                self._callbacks.append((self.queued, callback))
        if ready:
            callback()

    def close(self, timeout_s: float = 10.0) -> None:
        """Write what is queued, then stop the writer."""
        self.flush(timeout_s)
        with self._changed:
            self._closing = True
            self._changed.notify_all()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: bool(self._queue) or self._closing)
                if not self._queue:
                    return
                taken = list(self._queue)
                self._queue.clear()
            for batch in batches(taken):
                if not self._write(batch):
                    return
                self._done(batch[-1].seq)

    def _write(self, batch: list[Entry]) -> bool:
        """Write ``batch`` (trying again until it is written); False: this writer must stop."""
        try:  # (the store's records are made into rows here, off the loop: ``Store._commit``)
            changes = [c for entry in batch for c in entry.changes]
        except Exception as exc:  # a fault of the code, not of the backend: stop, do not hang
            self.on_fenced(RuntimeError(f"the store's rows could not be made: {exc!r}"))
            return False
        events = [e for entry in batch for e in entry.events]
        attempt = 0
        while True:
            try:
                self.backend.write(changes, events)
                self.failing = None
                return True
            except FileExistsError as exc:
                if attempt > 0:
                    return True  # an earlier try was written (its answer was lost): all of it
                self.on_fenced(RuntimeError(f"another writer numbers this store's events ({exc})"))
                return False
            except Fenced as exc:
                self.on_fenced(exc)
                return False
            except Exception as exc:  # the backend is unreachable or refuses: try again
                if self.failing != repr(exc):
                    print(f"unicron: the store's write failed, trying again: {exc!r}", file=sys.stderr)
                self.failing = repr(exc)
                time.sleep(RETRY_S[min(attempt, len(RETRY_S) - 1)])
                attempt += 1

    def _done(self, seq: int) -> None:
        with self._changed:
            self.durable = seq
            while self._waiting and self._waiting[0][0] <= seq:
                self._waiting.popleft()
            ready = [cb for upto, cb in self._callbacks if upto <= seq]
            self._callbacks = [(upto, cb) for upto, cb in self._callbacks if upto > seq]
            self._changed.notify_all()
        for callback in ready:
            callback()

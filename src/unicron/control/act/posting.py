"""Posts to the tasks' rendezvous stores, made once what they tell is durable, in order, off the
coordinator's loop.

A value posted for a task's workers (the membership that follows a generation, the current
generation, a hot spare's identity) steers processes outside the coordinator, so it must not run
ahead of the store (write-ahead, ``control/store/journal.py``): a successor has to know of every
generation a worker may already have joined. The poster used to wait for the journal on the
coordinator's event loop, twice per recovery in place (the membership, then the current
generation): a burst of worker crashes on 2,048 nodes spent over half of each decision there, and
with etcd underneath each wait is a network round trip and a disk sync, during which no heartbeat
is read. Here a post is queued with the journal's position at the time (``Journal.queued``) and
a thread of its own writes it once the journal is durable up to there: one post after another,
in the order they were made (a current generation is never posted before the membership that
leads to it).

The value is kept for the put-back (``Rendezvous.restore``) before it is written, so a write that
fails (the store's call timed out) is made again within a second. Without a journal (the stores
of tests stepped by hand) a post is written at once.
"""

from __future__ import annotations

import queue
import sys
import threading

from unicron.control.act.rendezvous import Rendezvous
from unicron.control.store.journal import Journal

DURABLE_WAIT_S = 1.0  # how long the poster waits at a time for the journal (then checks for close)


class Posts:
    def __init__(self, rendezvous: Rendezvous, journal: Journal | None) -> None:
        self._rendezvous, self._journal = rendezvous, journal
        # (the journal's position, the task, the number of its store, the key, the value)
        self._queue: queue.SimpleQueue[tuple[int, str, int | None, str, str] | None] = queue.SimpleQueue()
        self._pending = 0  # posts queued and not yet written (or given up)
        self._changed = threading.Condition()
        self._closing = False
        self._thread: threading.Thread | None = None
        if journal is not None:
            self._thread = threading.Thread(target=self._run, name="rendezvous-posts", daemon=True)
            self._thread.start()

    def post(self, task: str, key: str, value: str) -> None:
        """Write ``value`` under ``key`` in ``task``'s store once everything the coordinator
        changed so far is durable."""
        if self._journal is None:
            self._rendezvous.set(task, key, value)
            return
        with self._changed:
            self._pending += 1
        self._queue.put((self._journal.queued, task, self._rendezvous.epoch(task), key, value))

    def drain(self, timeout_s: float) -> bool:
        """Wait until every post queued so far is written; False if ``timeout_s`` ran out."""
        with self._changed:
            return self._changed.wait_for(lambda: self._pending == 0, timeout_s)

    def close(self, timeout_s: float = 2.0) -> None:
        """Write what is queued (for at most ``timeout_s``), then stop: a successor posts again
        what was kept (``Posted``)."""
        if self._thread is None:
            return
        self.drain(timeout_s)
        self._closing = True
        self._queue.put(None)
        self._thread.join(timeout_s)

    def _run(self) -> None:
        assert self._journal is not None
        while (item := self._queue.get()) is not None:
            durable_by, task, epoch, key, value = item
            while not self._journal.durable_by(durable_by, DURABLE_WAIT_S):
                if self._closing:
                    return  # the journal stopped (fenced, closed): nothing more is posted
            try:
                self._rendezvous.set(task, key, value, epoch)  # (not into a later task's store)
            except Exception as exc:  # the put-back writes it again (it was kept first)
                print(f"unicron: posting {key!r} for task {task!r} failed: {exc!r}", file=sys.stderr)
            with self._changed:
                self._pending -= 1
                self._changed.notify_all()

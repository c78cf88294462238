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
fails (the store's call timed out) is made again within a second. The put-back itself (every
live task's values written again, two round trips a task) is made by the same thread: on the
loop it took 50-130 ms each second at 100 tasks, waiting on sockets while no heartbeat was read.
One is wanted at a time (asked for again before it was made, it is made once, for the tasks
last asked for), in turn with the posts, and also while a post waits for the journal: what it
writes is durable already (a value is kept only once its post may be written), so a slow store
delays neither the put-back nor, by a backlog of them, the posts. What it found missing is
handed back (``restored``) for the loop to record. Without a journal (the stores of tests
stepped by hand) a post and a put-back are written at once.
"""

from __future__ import annotations

import queue
import sys
import threading
from collections import deque
from dataclasses import dataclass

from unicron.control.act.rendezvous import Rendezvous
from unicron.control.store.journal import Journal

DURABLE_WAIT_S = 1.0  # how long the poster waits at a time for the journal (then checks for close)


@dataclass(frozen=True)
class _Post:
    durable_by: int  # the journal's position when it was made
    task: str
    epoch: int | None  # the number of the task's store (not posted into a later task's)
    key: str
    value: str


class _PutBack:
    """In the queue: a put-back is wanted (of the tasks in ``Posts._wanted``, if still wanted)."""


class Posts:
    def __init__(self, rendezvous: Rendezvous, journal: Journal | None) -> None:
        self._rendezvous, self._journal = rendezvous, journal
        self._queue: queue.SimpleQueue[_Post | _PutBack | None] = queue.SimpleQueue()
        self._pending = 0  # posts and put-backs queued and not yet made (or given up)
        self._restored: deque[tuple[str, list[str]]] = deque()  # (task, keys found missing)
        self._wanted: tuple[str, ...] | None = None  # the tasks of the put-back wanted, if one is
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
        self._queue_up(_Post(self._journal.queued, task, self._rendezvous.epoch(task), key, value))

    def put_back(self, tasks: tuple[str, ...]) -> None:
        """Write every kept value of ``tasks`` again (see the module's docstring for when);
        what was found missing is handed back by ``restored``."""
        if self._journal is None:
            self._restore(tasks)
            return
        with self._changed:
            queued, self._wanted = self._wanted is not None, tasks
        if not queued:
            self._queue_up(_PutBack())

    def restored(self) -> list[tuple[str, list[str]]]:
        """The put-backs made since the last call: each task's keys that were found missing."""
        out = []
        while self._restored:
            out.append(self._restored.popleft())
        return out

    def _queue_up(self, item: _Post | _PutBack) -> None:
        with self._changed:
            self._pending += 1
        self._queue.put(item)

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
            if isinstance(item, _PutBack):
                if not self._closing:
                    self._put_back_wanted()
            elif not self._posted(item):
                return  # the journal stopped (fenced, closed): nothing more is posted
            with self._changed:
                self._pending -= 1
                self._changed.notify_all()

    def _posted(self, post: _Post) -> bool:
        """Write ``post`` once the journal is durable up to it; False: the journal stopped."""
        assert self._journal is not None
        while not self._journal.durable_by(post.durable_by, DURABLE_WAIT_S):
            if self._closing:
                return False
            self._put_back_wanted()  # (its values are durable: they need not wait for this one)
        try:
            self._rendezvous.set(post.task, post.key, post.value, post.epoch)
        except Exception as exc:  # the put-back writes it again (it was kept first)
            print(f"unicron: posting {post.key!r} for task {post.task!r} failed: {exc!r}", file=sys.stderr)
        return True

    def _put_back_wanted(self) -> None:
        with self._changed:
            tasks, self._wanted = self._wanted, None
        if tasks is not None:
            self._restore(tasks)

    def _restore(self, tasks: tuple[str, ...]) -> None:
        for task in tasks:
            try:
                self._restored.append((task, self._rendezvous.restore(task)))
            except Exception as exc:  # (the store's call timed out) the next put-back tries again
                print(f"unicron: putting back task {task!r}'s values failed: {exc!r}", file=sys.stderr)

"""Posts to a task's rendezvous store wait for the journal off the loop (control/act/posting.py):
a post returns at once, nothing is written before what it tells is durable, posts are written in
the order they were made, a post for an ended task is dropped, and a write that failed is put
back by the next put-back. A real TCPStore on loopback; the journal over a backend whose writes
are held back (tests/test_journal.py's)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest

from unicron.control.act.posting import Posts
from unicron.control.act.rendezvous import Rendezvous
from unicron.control.store.journal import Journal
from unicron.core.signing import opened

from .test_journal import Recording, put


class Watched(Rendezvous):
    """A rendezvous whose writes are listed in the order they happen (and can be made to fail)."""

    def __init__(self) -> None:
        super().__init__("127.0.0.1", os.urandom(64))
        self.written: list[str] = []
        self.fail_next = False

    def set(self, task: str, key: str, value: str, epoch: int | None = None) -> None:
        if self.fail_next:  # the store's call times out (its real client is put back after)
            self.fail_next, real = False, self._stores[task]
            self._stores[task] = Timeouts()
            try:
                super().set(task, key, value, epoch)
            finally:
                self._stores[task] = real
        super().set(task, key, value, epoch)
        if task in self._stores and epoch in (None, self.epoch(task)):
            self.written.append(key)


class Timeouts:
    def set(self, key: str, value: str) -> None:
        raise TimeoutError("the store's call timed out")


def read(rendezvous: Rendezvous, task: str, key: str) -> str | None:
    import torch.distributed as dist

    port = rendezvous.host(task)
    client = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=5))  # type: ignore[attr-defined]
    if not client.check([key]):
        return None
    return opened(rendezvous.key(task), key, client.get(key))


@pytest.fixture
def held() -> Iterator[tuple[Recording, Journal, Watched, Posts]]:
    backend = Recording()
    journal = Journal(backend, on_fenced=lambda exc: None)
    rendezvous = Watched()
    rendezvous.host("lm")
    posts = Posts(rendezvous, journal)
    yield backend, journal, rendezvous, posts
    backend.gate.set()
    posts.close()
    journal.close()
    rendezvous.close_all()


def test_a_post_waits_for_the_journal_without_holding_the_caller(
    held: tuple[Recording, Journal, Watched, Posts],
) -> None:
    backend, journal, rendezvous, posts = held
    backend.gate.clear()  # the store's writes are slow
    journal.put([put("membership row")])
    posts.post("lm", "lm/membership/1", "gen 2")  # returns at once
    journal.put([put("current row")])
    posts.post("lm", "lm/current", "2")
    assert not posts.drain(0.3), "written before what it tells was durable"
    assert rendezvous.written == [] and read(rendezvous, "lm", "lm/current") is None
    backend.gate.set()
    assert posts.drain(10)
    assert rendezvous.written == ["lm/membership/1", "lm/current"]  # in the order posted
    assert read(rendezvous, "lm", "lm/current") == "2"


def test_a_post_for_an_ended_task_is_dropped_and_a_failed_one_is_put_back(
    held: tuple[Recording, Journal, Watched, Posts],
) -> None:
    backend, journal, rendezvous, posts = held
    rendezvous.fail_next = True
    posts.post("lm", "lm/current", "3")
    posts.post("gone", "gone/current", "1")  # no store: the task ended
    assert posts.drain(10)
    assert rendezvous.written == [] and read(rendezvous, "lm", "lm/current") is None
    assert rendezvous.restore("lm") == []  # the next put-back writes it (not counted as deleted)
    assert read(rendezvous, "lm", "lm/current") == "3"
    # A post queued for a task that ended, its name then taken by another task, is dropped.
    backend.gate.clear()
    journal.put([put("the ended task's row")])
    posts.post("lm", "lm/current", "4")
    rendezvous.close("lm")
    rendezvous.host("lm")  # the next task of the name
    backend.gate.set()
    assert posts.drain(10)
    assert read(rendezvous, "lm", "lm/current") is None


def test_a_put_back_is_made_off_the_caller_once_while_a_post_waits_and_says_what_was_missing(
    held: tuple[Recording, Journal, Watched, Posts],
) -> None:
    """The put-back's round trips are the poster's, not the loop's: ``put_back`` returns at once.
    The values it writes are durable already, so it does not wait behind a post held by a slow
    store (it is made during the post's wait), and asked for again before it was made it is made
    once, for the tasks last asked for. The keys it found missing come back through ``restored``."""
    import torch.distributed as dist

    backend, journal, rendezvous, posts = held
    posts.post("lm", "lm/current", "1")
    assert posts.drain(10)
    port = rendezvous.host("lm")
    client = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=5))  # type: ignore[attr-defined]
    client.delete_key("lm/current")  # someone deletes it
    backend.gate.clear()
    journal.put([put("membership row")])
    posts.post("lm", "lm/membership/2", "gen 2")  # waits for the journal
    for _ in range(3):
        posts.put_back(("gone",))  # returns at once; "gone" has no store
    posts.put_back(("lm", "gone"))  # the one wanted now
    found: list[tuple[str, list[str]]] = []
    deadline = time.monotonic() + 10
    while not found and time.monotonic() < deadline:
        found += posts.restored()
        time.sleep(0.01)
    assert found == [("lm", ["lm/current"]), ("gone", [])], "not put back while the post waited"
    assert read(rendezvous, "lm", "lm/current") == "1"
    assert rendezvous.written == ["lm/current"]  # the held post is not written yet
    backend.gate.set()
    assert posts.drain(10)
    assert rendezvous.written == ["lm/current", "lm/membership/2"]
    assert posts.restored() == []  # made once

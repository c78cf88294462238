"""The store's write-behind journal (control/store/journal.py): batching (pure), order, durability
waits, retries and fencing, against a backend that records what it is given (pure logic; the
journal over real SQLite and etcd runs in tests/test_store.py's contract suite)."""

from __future__ import annotations

import threading
import time
import typing
from collections.abc import Sequence

from unicron.brain.records import EventRecord
from unicron.control.store.backend import Change, Fenced, Loaded, Put, Table
from unicron.control.store.journal import Entry, Journal, batches


def put(name: str) -> Put:
    return Put(Table.KEPT, (name,), {"name": name, "value": 1})


def event(i: int) -> EventRecord:
    return EventRecord(i, float(i), "x", None, None, {})


class Recording:
    """A backend whose writes are recorded, and fail while ``failures`` has entries."""

    def __init__(self) -> None:
        self.written: list[tuple[list[str], list[int]]] = []
        self.failures: list[Exception] = []
        self.gate = threading.Event()
        self.gate.set()

    def load(self) -> Loaded:
        return Loaded()

    def write(self, changes: Sequence[Change], events: Sequence[EventRecord] = ()) -> None:
        self.gate.wait(10)
        if self.failures:
            raise self.failures.pop(0)
        self.written.append(([str(c.key[0]) for c in changes], [e.id for e in events]))

    def events(
        self, since_id: int, task: str | None, limit: int, kinds: frozenset[str], newest: bool
    ) -> list[EventRecord]:
        return []

    def close(self) -> None:
        pass


def test_batches_keep_order_and_never_split_an_operation() -> None:
    entries = [Entry(i, [put(f"k{i}")] * size, []) for i, size in enumerate([3, 3, 5, 2, 9, 1], 1)]
    packed = batches(entries, max_ops=8)
    assert [[e.seq for e in b] for b in packed] == [[1, 2], [3, 4], [5], [6]]  # 9 > 8: alone
    assert [e.seq for b in packed for e in b] == [1, 2, 3, 4, 5, 6]


def test_writes_are_in_order_and_a_wait_ends_once_they_are_durable() -> None:
    backend = Recording()
    journal = Journal(backend, on_fenced=lambda exc: None)
    backend.gate.clear()  # the backend is slow: everything queues
    journal.put([put("a")])
    journal.put([], [event(1)])
    called: list[int] = []
    journal.when_durable(lambda: called.append(journal.durable))
    journal.put([put("b")], [event(2)])
    assert not journal.flush(timeout_s=0.05) and called == []
    backend.gate.set()
    assert journal.flush(timeout_s=10)
    assert called and called[0] >= 2  # called once what was queued before it was written
    keys = [k for ks, _ in backend.written for k in ks]
    ids = [i for _, es in backend.written for i in es]
    assert (keys, ids) == (["a", "b"], [1, 2])
    journal.when_durable(lambda: called.append(-1))  # nothing pending: at once
    assert called[-1] == -1
    journal.close()


def test_how_far_behind_the_writes_are_is_the_oldest_waiting_changes_age() -> None:
    """The store's write lag (``unicron_store_write_lag_seconds``): the age of the oldest change
    not yet durable, 0 once everything queued is written."""
    backend = Recording()
    journal = Journal(backend, on_fenced=lambda exc: None)
    assert journal.behind_s() == 0.0
    backend.gate.clear()  # the backend is slow
    first = time.monotonic()
    journal.put([put("a")])
    journal.put([put("b")])
    assert journal.behind_s(first + 5.0) >= 5.0 - 0.5  # (put a moment after ``first``)
    backend.gate.set()
    assert journal.flush(timeout_s=10) and journal.behind_s(first + 5.0) == 0.0
    journal.close()


def test_a_failed_write_is_tried_again_and_a_fenced_one_stops_the_writer() -> None:
    backend = Recording()
    fenced: list[Exception] = []
    journal = Journal(backend, on_fenced=fenced.append)
    backend.failures = [ConnectionError("etcd is electing"), ConnectionError("still")]
    journal.put([put("a")])
    assert journal.flush(timeout_s=10) and backend.written == [(["a"], [])] and journal.failing is None
    backend.failures = [FileExistsError("event 3")]  # first try: another writer took the id
    journal.put([], [event(3)])
    assert not journal.flush(timeout_s=0.5)
    assert len(fenced) == 1 and "another writer" in str(fenced[0])
    backend2 = Recording()
    journal2 = Journal(backend2, on_fenced=fenced.append)
    backend2.failures = [ConnectionError("answer lost"), FileExistsError("event 4")]
    journal2.put([], [event(4)])  # the first try was written, its answer lost: done
    assert journal2.flush(timeout_s=10) and len(fenced) == 1
    backend2.failures = [Fenced("b leads now")]
    journal2.put([put("c")])
    assert not journal2.flush(timeout_s=0.5) and isinstance(fenced[-1], Fenced)
    journal2.close(timeout_s=0.1)


class Unmakeable(Sequence[Change]):
    """One operation's changes whose rows cannot be made (a fault of the code)."""

    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: typing.Any) -> typing.Any:
        raise ValueError("no row for this record")


def test_changes_whose_rows_cannot_be_made_stop_the_writer_rather_than_hang_every_wait() -> None:
    """The store's records are made into rows by the writer's thread: a record it cannot make one
    of stops the writer through ``on_fenced`` (the coordinator exits), where it would have ended
    the thread silently and left every wait for durability waiting for ever."""
    backend, fenced = Recording(), list[Exception]()
    journal = Journal(backend, on_fenced=fenced.append)
    journal.put([put("a")])
    assert journal.flush(timeout_s=10)
    journal.put(Unmakeable())
    assert not journal.flush(timeout_s=0.5)
    assert backend.written == [(["a"], [])] and len(fenced) == 1 and "could not be made" in str(fenced[0])
    journal.close(timeout_s=0.1)

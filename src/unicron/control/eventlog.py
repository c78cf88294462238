"""The coordinator's SQLite database as the store uses it (one connection, one lock,
transactions that commit at once), and its event log: what happened, to which task, on which
node, in order. ``store.py`` builds on it; with ``schema.py`` these are the only SQL."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from unicron.control.records import EventRecord
from unicron.control.schema import open_database


def placeholders(values: Iterable[object]) -> tuple[str, list[str]]:
    items = [str(v) for v in values]
    return ",".join("?" * len(items)), items


class Database:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._db = open_database(path)
        self._lock = threading.RLock()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _rows(self, sql: str, *args: object) -> list[sqlite3.Row]:
        with self._lock:
            return list(self._db.execute(sql, args).fetchall())

    # ------------------------------------------------------------ the event log
    def event(self, what: str, task: str | None = None, node: str | None = None, **detail: Any) -> int:
        """Record that ``what`` happened, to ``task`` and/or on ``node``; returns the event's id."""
        with self._tx() as db:
            cursor = db.execute(
                "INSERT INTO events (time, kind, task, node, detail) VALUES (?, ?, ?, ?, ?)",
                (time.time(), what, task, node, json.dumps(detail, default=str)),
            )
            return int(cursor.lastrowid or 0)

    def events(
        self,
        since_id: int = 0,
        task: str | None = None,
        limit: int = 1000,
        kinds: Iterable[str] = (),
        newest: bool = False,
    ) -> list[EventRecord]:
        """Events after ``since_id``, in order: the first ``limit`` (``newest``: the last) of
        ``task``'s, of ``kinds``."""
        where, args = ["id > ?"], list[object]([since_id])
        if task is not None:
            where.append("task = ?")
            args.append(task)
        if kinds:
            marks, values = placeholders(kinds)
            where.append(f"kind IN ({marks})")
            args += values
        order = "DESC" if newest else "ASC"
        sql = f"SELECT * FROM events WHERE {' AND '.join(where)} ORDER BY id {order} LIMIT ?"
        found = [EventRecord.of(r) for r in self._rows(sql, *args, limit)]
        return found[::-1] if newest else found

    def last_node_event(self, node: str, kinds: Iterable[str]) -> str | None:
        """The kind of the newest of ``kinds`` recorded on ``node``, or None."""
        marks, values = placeholders(kinds)
        rows = self._rows(
            f"SELECT kind FROM events WHERE node = ? AND kind IN ({marks}) ORDER BY id DESC LIMIT 1",
            node,
            *values,
        )
        return str(rows[0]["kind"]) if rows else None

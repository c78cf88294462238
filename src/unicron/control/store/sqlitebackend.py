"""The store's embedded backend: one SQLite file (WAL), one connection behind one lock, each
write one transaction. With ``schema.py`` (its tables), the only SQL."""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from unicron.brain.records import EventRecord, NodeRecord, TaskRecord, WorkerRecord
from unicron.control.private import private_dir, private_file
from unicron.control.store.backend import Change, Delete, Loaded, Table
from unicron.control.store.schema import open_database

KEY_COLUMNS = {
    Table.TASKS: ("name",),
    Table.NODES: ("name",),
    Table.WORKERS: ("task", "generation", "rank"),
    Table.COUNTED: ("task", "generation", "rank"),
    Table.KEPT: ("name",),
}


def placeholders(values: Iterable[object]) -> tuple[str, list[str]]:
    items = [str(v) for v in values]
    return ",".join("?" * len(items)), items


def _column(value: Any) -> Any:
    return json.dumps(value) if isinstance(value, list | dict) else value


class SqliteBackend:
    def __init__(self, path: Path) -> None:
        # Its rows hold every task's programs, arguments and environment: the file (SQLite makes
        # its -wal and -shm files with the same mode) readable by its owner only, in a private
        # directory (``control/private.py``).
        private_file(private_dir(path.parent) / path.name)
        self.path = path
        self._db = open_database(path)
        for extra in (path.with_name(f"{path.name}-wal"), path.with_name(f"{path.name}-shm")):
            if extra.exists():  # left by a version that made them readable by others
                private_file(extra)
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

    def load(self) -> Loaded:
        return Loaded(
            tasks=[TaskRecord.of(dict(r)) for r in self._rows("SELECT * FROM tasks")],
            nodes=[NodeRecord.of(dict(r)) for r in self._rows("SELECT * FROM nodes")],
            workers=[WorkerRecord.of(dict(r)) for r in self._rows("SELECT * FROM workers")],
            counted={
                (r["task"], int(r["generation"]), int(r["rank"])): int(r["step"])
                for r in self._rows("SELECT * FROM counted")
            },
            kept={r["name"]: json.loads(r["value"]) for r in self._rows("SELECT * FROM kept")},
            last_event_id=int(self._rows("SELECT COALESCE(MAX(id), 0) AS last FROM events")[0]["last"]),
        )

    def write(self, changes: Sequence[Change], events: Sequence[EventRecord] = ()) -> None:
        with self._tx() as db:
            for e in events:
                try:
                    db.execute(
                        "INSERT INTO events (id, time, kind, task, node, detail) VALUES (?, ?, ?, ?, ?, ?)",
                        (e.id, e.time, e.kind, e.task, e.node, json.dumps(e.detail)),
                    )
                except sqlite3.IntegrityError:
                    raise FileExistsError(f"event {e.id}") from None
            for change in changes:
                table, keys = change.table.value, KEY_COLUMNS[change.table]
                if isinstance(change, Delete):
                    where = " AND ".join(f"{k} = ?" for k in keys)
                    db.execute(f"DELETE FROM {table} WHERE {where}", change.key)
                    continue
                columns = list(change.values)
                marks = placeholders(columns)[0]
                db.execute(
                    f"INSERT OR REPLACE INTO {table} ({', '.join(columns)}) VALUES ({marks})",
                    [_column(change.values[c]) for c in columns],
                )

    # ------------------------------------------------------------ the event log
    def events(
        self, since_id: int, task: str | None, limit: int, kinds: frozenset[str], newest: bool
    ) -> list[EventRecord]:
        where, args = ["id > ?"], list[object]([since_id])
        if task is not None:
            where.append("task = ?")
            args.append(task)
        if kinds:
            marks, values = placeholders(sorted(kinds))
            where.append(f"kind IN ({marks})")
            args += values
        order = "DESC" if newest else "ASC"
        sql = f"SELECT * FROM events WHERE {' AND '.join(where)} ORDER BY id {order} LIMIT ?"
        found = [EventRecord.of(dict(r)) for r in self._rows(sql, *args, limit)]
        return found[::-1] if newest else found

    def close(self) -> None:
        with self._lock:
            self._db.close()

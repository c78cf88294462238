"""The coordinator's durable state in SQLite: nodes, tasks, workers (slots held per generation)
and events. Every change is committed at once, so a restarted coordinator loses nothing.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS nodes (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT UNIQUE NOT NULL,
    slots INTEGER NOT NULL,
    gpus TEXT NOT NULL DEFAULT '[]',
    host TEXT NOT NULL,
    state TEXT NOT NULL,            -- healthy | lost | isolated
    last_seen REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS tasks (
    name TEXT PRIMARY KEY,
    spec TEXT NOT NULL,             -- the submitted spec, JSON
    -- waiting | starting | running | restarting | finished | failed | cancelled
    state TEXT NOT NULL,
    generation INTEGER NOT NULL DEFAULT 0,
    workers INTEGER NOT NULL DEFAULT 0,
    step INTEGER NOT NULL DEFAULT 0,
    checkpoint_step INTEGER NOT NULL DEFAULT 0,
    store_port INTEGER NOT NULL DEFAULT 0,
    failures INTEGER NOT NULL DEFAULT 0,
    restarts INTEGER NOT NULL DEFAULT 0,
    down_since REAL,                -- when the task last stopped making progress
    downtime_s REAL NOT NULL DEFAULT 0,
    samples INTEGER NOT NULL DEFAULT 0,
    flop REAL NOT NULL DEFAULT 0,   -- weighted FLOP achieved (WAF integrated over time)
    digest TEXT,
    submitted REAL NOT NULL,
    started REAL,
    finished REAL
);
CREATE TABLE IF NOT EXISTS workers (
    task TEXT NOT NULL,
    generation INTEGER NOT NULL,
    rank INTEGER NOT NULL,
    node TEXT NOT NULL,
    local_rank INTEGER NOT NULL,
    state TEXT NOT NULL,            -- launching | running | exited | failed | lost | stopped
    pid INTEGER,
    exit_code INTEGER,
    exit_signal INTEGER,
    launched REAL NOT NULL,
    PRIMARY KEY (task, generation, rank)
);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    time REAL NOT NULL,
    kind TEXT NOT NULL,
    task TEXT,
    node TEXT,
    detail TEXT NOT NULL DEFAULT '{}'
);
"""

LIVE_TASK_STATES = ("waiting", "starting", "running", "restarting")
LIVE_WORKER_STATES = ("launching", "running")


@dataclass(frozen=True)
class Row:
    """A row as a read-only mapping with attribute access."""

    data: dict[str, Any]

    def __getattr__(self, name: str) -> Any:
        try:
            return self.data[name]
        except KeyError:
            raise AttributeError(name) from None


class Store:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._lock = threading.RLock()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(SCHEMA)

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def query(self, sql: str, *args: Any) -> list[Row]:
        with self._lock:
            return [Row(dict(r)) for r in self._db.execute(sql, args).fetchall()]

    def one(self, sql: str, *args: Any) -> Row | None:
        rows = self.query(sql, *args)
        return rows[0] if rows else None

    def execute(self, sql: str, *args: Any) -> None:
        with self.transaction() as db:
            db.execute(sql, args)

    # ------------------------------------------------------------ events
    def event(self, what: str, task: str | None = None, node: str | None = None, **detail: Any) -> None:
        """Record an event: ``what`` happened, to ``task`` and/or on ``node``, with details."""
        self.execute(
            "INSERT INTO events (time, kind, task, node, detail) VALUES (?, ?, ?, ?, ?)",
            time.time(),
            what,
            task,
            node,
            json.dumps(detail, default=str),
        )

    def events(self, since_id: int = 0, task: str | None = None, limit: int = 1000) -> list[dict[str, Any]]:
        sql = "SELECT * FROM events WHERE id > ?"
        args: list[Any] = [since_id]
        if task is not None:
            sql += " AND task = ?"
            args.append(task)
        sql += " ORDER BY id LIMIT ?"
        args.append(limit)
        return [{**r.data, "detail": json.loads(r.detail)} for r in self.query(sql, *args)]

    # ------------------------------------------------------------ shortcuts
    def task(self, name: str) -> Row | None:
        return self.one("SELECT * FROM tasks WHERE name = ?", name)

    def tasks(self, live_only: bool = False) -> list[Row]:
        if live_only:
            marks = ",".join("?" * len(LIVE_TASK_STATES))
            return self.query(
                f"SELECT * FROM tasks WHERE state IN ({marks}) ORDER BY submitted", *LIVE_TASK_STATES
            )
        return self.query("SELECT * FROM tasks ORDER BY submitted")

    def nodes(self) -> list[Row]:
        return self.query("SELECT * FROM nodes ORDER BY id")

    def node(self, name: str) -> Row | None:
        return self.one("SELECT * FROM nodes WHERE name = ?", name)

    def workers(
        self, task: str | None = None, generation: int | None = None, live: bool = False
    ) -> list[Row]:
        sql = "SELECT * FROM workers WHERE 1=1"
        args: list[Any] = []
        if task is not None:
            sql += " AND task = ?"
            args.append(task)
        if generation is not None:
            sql += " AND generation = ?"
            args.append(generation)
        if live:
            sql += " AND state IN ('launching', 'running')"
        return self.query(sql + " ORDER BY task, generation, rank", *args)

    def update(self, table: str, key: dict[str, Any], **values: Any) -> None:
        sets = ", ".join(f"{k} = ?" for k in values)
        where = " AND ".join(f"{k} = ?" for k in key)
        self.execute(f"UPDATE {table} SET {sets} WHERE {where}", *values.values(), *key.values())

    def close(self) -> None:
        with self._lock:
            self._db.close()

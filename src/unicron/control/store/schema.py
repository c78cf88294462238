"""The store's tables, and the migration of a store written by an older version."""

from __future__ import annotations

import sqlite3
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS nodes (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT UNIQUE NOT NULL,
    slots INTEGER NOT NULL,
    gpus TEXT NOT NULL DEFAULT '[]',
    host TEXT NOT NULL,
    state TEXT NOT NULL,
    last_seen REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS tasks (
    name TEXT PRIMARY KEY,
    spec TEXT NOT NULL,
    state TEXT NOT NULL,
    generation INTEGER NOT NULL DEFAULT 0,
    workers INTEGER NOT NULL DEFAULT 0,
    step INTEGER NOT NULL DEFAULT 0,
    checkpoint_step INTEGER NOT NULL DEFAULT 0,
    store_port INTEGER NOT NULL DEFAULT 0,
    failures INTEGER NOT NULL DEFAULT 0,
    restarts INTEGER NOT NULL DEFAULT 0,
    down_since REAL,
    downtime_s REAL NOT NULL DEFAULT 0,
    samples INTEGER NOT NULL DEFAULT 0,
    flop REAL NOT NULL DEFAULT 0,
    digest TEXT,
    submitted REAL NOT NULL,
    started REAL,
    finished REAL,
    reason TEXT,
    launched_generation INTEGER NOT NULL DEFAULT 0,
    redo_until INTEGER NOT NULL DEFAULT 0,
    run INTEGER NOT NULL DEFAULT 1,
    first_generation INTEGER NOT NULL DEFAULT 1,
    down_from REAL
);
CREATE TABLE IF NOT EXISTS workers (
    task TEXT NOT NULL,
    generation INTEGER NOT NULL,
    rank INTEGER NOT NULL,
    node TEXT NOT NULL,
    local_rank INTEGER NOT NULL,
    state TEXT NOT NULL,
    pid INTEGER,
    exit_code INTEGER,
    exit_signal INTEGER,
    launched REAL NOT NULL,
    PRIMARY KEY (task, generation, rank)
);
-- The last step of each rank already counted: a report sent again (an agent resending what a
-- coordinator that then died had received) is not counted twice.
CREATE TABLE IF NOT EXISTS counted (
    task TEXT NOT NULL,
    generation INTEGER NOT NULL,
    rank INTEGER NOT NULL,
    step INTEGER NOT NULL,
    PRIMARY KEY (task, generation, rank)
);
-- What the coordinator's parts keep across a restart, as JSON: the severity ladder's history,
-- the measured rates the planner uses.
CREATE TABLE IF NOT EXISTS kept (
    name TEXT PRIMARY KEY,
    value TEXT NOT NULL
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

# Columns added since the first version: (table, column, definition).
ADDED_COLUMNS = (
    ("tasks", "reason", "TEXT"),
    ("tasks", "launched_generation", "INTEGER NOT NULL DEFAULT 0"),
    ("tasks", "redo_until", "INTEGER NOT NULL DEFAULT 0"),
    ("tasks", "run", "INTEGER NOT NULL DEFAULT 1"),
    ("tasks", "first_generation", "INTEGER NOT NULL DEFAULT 1"),
    ("tasks", "down_from", "REAL"),
    ("nodes", "probe_port", "INTEGER NOT NULL DEFAULT 0"),
    ("nodes", "domain", "TEXT"),
    ("nodes", "drained", "INTEGER NOT NULL DEFAULT 0"),
    ("workers", "joining", "INTEGER NOT NULL DEFAULT 0"),
)


def open_database(path: Path) -> sqlite3.Connection:
    """Open (creating or migrating) the store at ``path``, in autocommit mode with WAL."""
    db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    db.row_factory = sqlite3.Row
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.executescript(SCHEMA)
    for table, column, definition in ADDED_COLUMNS:
        present = {r["name"] for r in db.execute(f"PRAGMA table_info({table})")}
        if column not in present:  # a store written before the column existed
            db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {definition}")
    return db

"""Where the store keeps its state: a location names the backend that serves it."""

from __future__ import annotations

from pathlib import Path

from unicron.control.store.backend import Backend
from unicron.control.store.sqlitebackend import SqliteBackend
from unicron.core.extras import require


def open_backend(location: str | Path) -> Backend:
    """``etcd://host:port,host:port[/prefix]``, or a SQLite file's path."""
    text = str(location)
    if text.startswith("etcd://"):
        # Imported only here: its client (etcd3gw, requests) takes ~0.2 s to import, which a
        # coordinator on SQLite would pay at every start; and it is an extra's.
        require("etcd3gw", "etcd", "a store on etcd")
        from unicron.control.store.etcdbackend import EtcdBackend

        return EtcdBackend.from_url(text)
    return SqliteBackend(Path(text))

"""Where the store keeps its state: a location names the backend that serves it."""

from __future__ import annotations

from pathlib import Path

from unicron.control.store.backend import Backend
from unicron.control.store.etcdbackend import EtcdBackend
from unicron.control.store.sqlitebackend import SqliteBackend


def open_backend(location: str | Path) -> Backend:
    """``etcd://host:port,host:port[/prefix]``, or a SQLite file's path."""
    text = str(location)
    if text.startswith("etcd://"):  # (its client library is imported then: ``EtcdClients``)
        return EtcdBackend.from_url(text)
    return SqliteBackend(Path(text))

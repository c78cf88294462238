"""Where a worker looks for its task's rendezvous store.

A worker is launched with the store's address, and the same port on each other coordinator's
host (where one that takes over serves it: ``WorkerEnv.store_addresses``). A coordinator that
starts over where another process took that port serves the store on another one; it tells the
nodes of the task's workers, whose agents write ``<old port> <host:port>`` to the file the
worker contract names (``WorkerEnv.store_file``, ``control/agent/supervisor.py:store_moved``).
A worker reads it whenever its store stops answering, and follows it only from a port it was
launched with: the file of an earlier task of the same name, left on the node, moved a port
this task's workers never used.
"""

from __future__ import annotations

from pathlib import Path

from unicron.core.workerenv import addresses


def told(store_file: str | None, launched: list[str]) -> str | None:
    """The address the agent wrote to ``store_file``, if it moved from a port of ``launched``
    (None: no such file, or a move of some other store)."""
    if not store_file:
        return None
    try:
        words = Path(store_file).read_text().split()
    except (OSError, UnicodeDecodeError):
        return None
    if len(words) != 2 or words[0] not in {a.rsplit(":", 1)[1] for a in launched}:
        return None
    return words[1]


def current(launched: str, store_file: str | None) -> list[str]:
    """Where to look for the store, in order: where the agent said it moved, then the
    comma-separated addresses the worker was launched with."""
    known = addresses(launched)
    moved = told(store_file, known)
    return known if moved is None else [moved, *(a for a in known if a != moved)]

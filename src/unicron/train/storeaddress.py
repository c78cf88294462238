"""Where a worker looks for its task's rendezvous store.

A worker is launched with the store's address, and the same port on each other coordinator's
host (where one that takes over serves it: ``WorkerEnv.store_addresses``). A coordinator that
starts over where another process took that port serves the store on another one; it tells the
nodes of the task's workers, whose agents add a line ``<old port> <host:port>`` to the file the
worker contract names (``WorkerEnv.store_file``, ``control/agent/supervisor.py:store_moved``),
oldest first. A worker reads it whenever its store stops answering and follows the moves from
a port it was launched with, one after another: one that missed a move (its store answered
until the next) still finds where the last one went. A move from a port none of its earlier
moves reached is of some other store (the file of an earlier task of the same name, left on
the node, moved a port this task's workers never used).
"""

from __future__ import annotations

from pathlib import Path

from unicron.core.workerenv import addresses


def told(store_file: str | None, launched: list[str]) -> str | None:
    """Where the moves the agent wrote to ``store_file`` lead from a port of ``launched`` (None:
    no such file, or no move of this store)."""
    if not store_file:
        return None
    try:
        lines = Path(store_file).read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    ports, reached = {a.rsplit(":", 1)[1] for a in launched}, None
    for line in lines:
        words = line.split()
        if len(words) == 2 and words[0] in ports:
            reached = words[1]
            ports = {reached.rsplit(":", 1)[1]}
    return reached


def current(launched: str, store_file: str | None) -> list[str]:
    """Where to look for the store, in order: where the agent said it moved, then the
    comma-separated addresses the worker was launched with."""
    known = addresses(launched)
    moved = told(store_file, known)
    return known if moved is None else [moved, *(a for a in known if a != moved)]

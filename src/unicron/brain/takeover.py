"""What a coordinator starting over a kept store decides for a task whose rendezvous store it
could not serve where the task's workers look for it.

A running worker looks for its task's store at the address it was launched with, then at the
same port on each other coordinator's host (``WorkerEnv.store_addresses``). A coordinator that
starts over (a restart, a takeover) serves each live task's store again on its kept port; where
another process holds that port on its host, the store is served on another one. The nodes of
the task's workers and spares are told: their agents write the new address where the workers
look when their store stops answering (``train/storeaddress.py``), and training goes on where it
is; workers launched from then on are given the new port. Nothing is stopped and no failure is
counted (the task did nothing wrong); the event says where the store went and whom it told.
"""

from __future__ import annotations

from collections.abc import Collection

from unicron.brain.effects import Effect, Record, TellStore
from unicron.brain.records import TaskRecord

STORE_MOVED = "task_store_moved"


def store_moved(task: TaskRecord, kept: int, address: str, nodes: Collection[str]) -> tuple[Effect, ...]:
    """The effects for ``task``, whose store was kept on port ``kept`` and is now served at
    ``address`` (host:port): ``nodes``, where its workers or spares are, are told (none: a task
    waiting to be launched, which is launched with the new port anyway)."""
    told = tuple(sorted(nodes))
    detail = {
        "kept_port": kept,
        "port": int(address.rsplit(":", 1)[1]),
        "generation": task.generation,
        "told": list(told),
        "why": f"port {kept} was taken on this coordinator's host",
    }
    said = Record(STORE_MOVED, task.name, None, detail)
    return (said, TellStore(task.name, kept, address, told)) if told else (said,)

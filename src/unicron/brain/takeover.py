"""What a coordinator starting over a kept store decides for a task whose rendezvous store it
could not serve where the task's workers look for it.

A running worker looks for its task's store at the address it was launched with, then at the
same port on each other coordinator's host (``WorkerEnv.store_addresses``). A coordinator that
starts over (a restart, a takeover) serves each live task's store again on its kept port; where
another process holds that port on its host, the store is served on another one, which no
running worker is told of. Such a worker trains on but can commit no checkpoint and follow no
membership change (its store stays silent), so the task would never finish. It is relaunched
from its newest durable checkpoint instead, its new workers launched with the new port; no failure
is counted (the task did nothing wrong), and the event says why.
"""

from __future__ import annotations

from unicron.brain.effects import Effect, Record, StopGeneration, Stopping
from unicron.brain.records import TaskRecord

STORE_MOVED = "task_store_moved"


def store_moved(task: TaskRecord, kept: int, served: int, grace_s: float) -> tuple[Effect, ...]:
    """The effects for ``task``, whose store was kept on port ``kept`` and is now served on
    ``served``: a task whose workers run (or should) stops its generation within ``grace_s``
    and waits for the plan to relaunch it; one with none (waiting, or already stopping to
    relaunch) launches its next workers with the new port anyway, and only the move is said. Its
    hot spares, which wait on the old port, are stopped by the plan once it no longer runs."""
    relaunch = task.state.active
    detail = {
        "kept_port": kept,
        "port": served,
        "generation": task.generation,
        "relaunched": relaunch,
        "why": moved_why(kept, served)
        if relaunch
        else f"port {kept} was taken on this coordinator's host; no worker of it runs",
    }
    said = Record(STORE_MOVED, task.name, None, detail)
    if not relaunch:
        return (said,)
    return (said, StopGeneration(task.name, task.generation, grace_s), Stopping(task.name))


def moved_why(kept: int, served: int) -> str:
    """Why a task whose store moved from port ``kept`` to ``served`` is relaunched."""
    return (
        f"port {kept} was taken on this coordinator's host: its running workers, which look for "
        f"the store there, cannot reach it on port {served}"
    )

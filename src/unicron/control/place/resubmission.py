"""Whether a task's name may be submitted: a new name, or one whose task has ended.

A name is a task's handle for its user (``unicron cancel NAME``, ``status``, ``events --task``),
as a job's name is in Slurm or a Job's in Kubernetes. A task that ended (finished, failed or
cancelled) gives its name back: submitting the name again starts a new task, its next run,
and the ended one is kept, readable, as ``NAME#RUN`` (``Store.replace_task``) with its events
still under ``NAME``. A live task keeps its name; the refusal says what to do.

One more wait: an ended task's processes may still be exiting (a cancel sends SIGTERM, then
SIGKILL after the grace period). Their rows hold their slots until each exit is reported, and
those exits must still reach their own task: the name is free once none is left.
"""

from __future__ import annotations

from collections.abc import Iterable

from unicron.brain.records import TaskRecord, WorkerRecord
from unicron.core.errors import Conflict


def reusable(name: str, task: TaskRecord | None, holding: Iterable[WorkerRecord]) -> bool:
    """True: ``name`` is taken by an ended task, which a new one replaces; False: the name is
    new. Raises :class:`Conflict`, saying what to do, when it cannot be used now. ``holding``:
    the rows that hold a slot (every task's)."""
    if task is None:
        return False
    if task.state.live:
        raise Conflict(
            f"a task named {name!r} is {task.state.value}: cancel it first (`unicron cancel {name}`), "
            "or choose another name"
        )
    stopping = sum(1 for w in holding if w.task == name)
    if stopping:
        raise Conflict(
            f"task {name!r} has {task.state.value} but {stopping} of its processes are still "
            "exiting: submit it again once they have (seconds: each gets SIGTERM, then SIGKILL after "
            "the grace period)"
        )
    return True

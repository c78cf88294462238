"""The states of tasks, nodes and workers, and the transitions allowed between them.

The coordinator's store refuses any other transition with :class:`IllegalTransition`: a write
that would, say, bring a finished task back to ``running`` is a bug to surface, not a row to
overwrite. Writing the same state again (a progress update) is no transition and always allowed.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import TypeVar


class TaskState(StrEnum):
    WAITING = "waiting"  # no workers: queued, or between a stop and the next launch
    STARTING = "starting"  # a generation is launched or re-forming; no step done in it yet
    RUNNING = "running"  # steps complete
    RESTARTING = "restarting"  # its generation is being stopped for a relaunch
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def live(self) -> bool:
        return self in LIVE_TASK_STATES

    @property
    def active(self) -> bool:
        """Workers of its current generation are (or should be) running."""
        return self in (TaskState.STARTING, TaskState.RUNNING)


class NodeState(StrEnum):
    HEALTHY = "healthy"
    LOST = "lost"  # its heartbeats stopped
    ISOLATED = "isolated"  # out of use for a while after hardware errors
    DRAINING = "draining"  # taken out by an admin: its work moves off, nothing new comes (until resumed)


class WorkerPhase(StrEnum):
    LAUNCHING = "launching"  # ordered, not yet seen running
    RUNNING = "running"
    SPARE = "spare"  # a hot spare waiting to be used
    USED = "used"  # a spare that took a newcomer's identity (the newcomer has its own row)
    MOVED = "moved"  # a survivor renamed into the next generation (that generation has its row)
    EXITED = "exited"  # ended with code 0
    FAILED = "failed"  # ended otherwise
    LOST = "lost"  # its node was lost
    STOPPED = "stopped"  # stopped by the coordinator

    @property
    def live(self) -> bool:
        return self in LIVE_WORKER_PHASES


LIVE_TASK_STATES = (TaskState.WAITING, TaskState.STARTING, TaskState.RUNNING, TaskState.RESTARTING)
LIVE_WORKER_PHASES = (WorkerPhase.LAUNCHING, WorkerPhase.RUNNING)
# Workers that hold a local slot (device) on their node.
SLOT_HOLDING_PHASES = (WorkerPhase.LAUNCHING, WorkerPhase.RUNNING, WorkerPhase.SPARE)

_T = TaskState
TASK_TRANSITIONS: Mapping[TaskState, frozenset[TaskState]] = {
    _T.WAITING: frozenset({_T.STARTING, _T.CANCELLED, _T.FAILED}),
    # STARTING -> STARTING: a second recovery before the first step of a generation.
    _T.STARTING: frozenset({_T.STARTING, _T.RUNNING, _T.RESTARTING, _T.FINISHED, _T.FAILED, _T.CANCELLED}),
    _T.RUNNING: frozenset({_T.STARTING, _T.RESTARTING, _T.FINISHED, _T.FAILED, _T.CANCELLED}),
    _T.RESTARTING: frozenset({_T.WAITING, _T.FAILED, _T.CANCELLED}),
    _T.FINISHED: frozenset(),
    _T.FAILED: frozenset(),
    _T.CANCELLED: frozenset(),
}
_N = NodeState
NODE_TRANSITIONS: Mapping[NodeState, frozenset[NodeState]] = {
    _N.HEALTHY: frozenset({_N.LOST, _N.ISOLATED, _N.DRAINING}),
    _N.ISOLATED: frozenset({_N.HEALTHY, _N.LOST, _N.DRAINING}),
    _N.DRAINING: frozenset({_N.HEALTHY, _N.LOST}),  # resumed by an admin, or silent
    _N.LOST: frozenset({_N.HEALTHY, _N.ISOLATED, _N.DRAINING}),  # its agent registered again
}
_W = WorkerPhase
_ENDED = frozenset({_W.EXITED, _W.FAILED, _W.LOST, _W.STOPPED})
WORKER_TRANSITIONS: Mapping[WorkerPhase, frozenset[WorkerPhase]] = {
    _W.LAUNCHING: _ENDED | {_W.RUNNING, _W.MOVED},
    _W.RUNNING: _ENDED | {_W.MOVED},
    _W.SPARE: _ENDED | {_W.USED},
    _W.USED: frozenset(),
    _W.MOVED: frozenset(),
    _W.EXITED: frozenset(),
    _W.FAILED: frozenset(),
    _W.LOST: frozenset(),
    _W.STOPPED: frozenset(),
}


S = TypeVar("S", bound=StrEnum)


class IllegalTransition(RuntimeError):
    """A state change the transition tables above do not allow: a bug in the coordinator."""

    def __init__(self, what: str, before: StrEnum, after: StrEnum) -> None:
        super().__init__(f"{what}: {before.value} -> {after.value} is not an allowed transition")
        self.before, self.after = before, after


def allowed(table: Mapping[S, frozenset[S]], before: S, after: S) -> bool:
    return before == after or after in table[before]


def check(what: str, table: Mapping[S, frozenset[S]], before: S, after: S) -> None:
    """Raise :class:`IllegalTransition` unless ``before -> after`` is allowed (or no change)."""
    if not allowed(table, before, after):
        raise IllegalTransition(what, before, after)


def sources(table: Mapping[S, frozenset[S]], after: S) -> tuple[str, ...]:
    """The states from which ``after`` may be entered (for bulk updates that filter on them)."""
    return tuple(s.value for s, targets in table.items() if after in targets)

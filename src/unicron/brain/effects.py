"""What a decision asks to be done, as frozen values: the deciders return them
(``brain/response.py``, the coordinator's planner and membership changes) and the coordinator's
applier (``control/act/effects.py:Applier``) is the one place that carries them out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from unicron.brain.records import WorkerRecord
from unicron.core.protocol import Membership
from unicron.core.states import TaskState, WorkerPhase


@dataclass(frozen=True)
class Launch:
    """Start workers of a generation: ``placement`` node -> count, ranks from ``first_rank``
    (``joining``: a grow's newcomers, which take their state from its live members)."""

    task: str
    generation: int
    world_size: int
    placement: dict[str, int]
    first_rank: int
    argv: list[str]
    env: dict[str, str]
    phase: WorkerPhase = WorkerPhase.LAUNCHING
    joining: bool = False


@dataclass(frozen=True)
class Switch:
    """Members of ``old`` that go on (``kept``) form ``membership``, which gives each its new
    rank; their agents rename them and the membership is posted where the members wait for it.
    (The workers, not a worker -> rank map: hashing records by the thousand for the map was
    most of a large task's recovery decision.)"""

    task: str
    old: int
    membership: Membership
    kept: tuple[WorkerRecord, ...]

    def renamed(self) -> list[tuple[WorkerRecord, int]]:
        """Each kept worker with its rank in the new generation."""
        ranks = self.membership.ranks
        return [(w, ranks[w.rank]) for w in self.kept]


@dataclass(frozen=True)
class Record:
    """An event in the store's log."""

    kind: str
    task: str | None = None
    node: str | None = None
    detail: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TaskDown:
    """A failure took the task down: it recovers (``STARTING`` in place, ``RESTARTING``) or fails."""

    task: str
    to: TaskState
    reason: str | None = None
    began: float | None = None  # when the failure began (its downtime counts from then)


@dataclass(frozen=True)
class StopWorker:
    worker: WorkerRecord
    grace_s: float


@dataclass(frozen=True)
class StopGeneration:
    task: str
    generation: int
    grace_s: float


@dataclass(frozen=True)
class Isolate:
    """Take a node out of service until ``until`` (None: until an operator resumes it, a device
    that computed wrong values), stopping what runs there."""

    node: str
    why: str
    until: float | None
    grace_s: float


@dataclass(frozen=True)
class UseSpare:
    """A hot spare (``spare_rank`` on ``node``, its ``local`` slot) becomes newcomer ``rank`` of
    ``generation`` (of ``world`` workers): no process starts, it takes a new identity."""

    task: str
    spare_rank: int
    node: str
    local: int
    generation: int
    rank: int
    world: int


@dataclass(frozen=True)
class Resized:
    """The task's workers now form ``generation``, ``workers`` of them (in place: a grow's
    newcomers let in)."""

    task: str
    generation: int
    workers: int


@dataclass(frozen=True)
class EndWorkers:
    """Every live worker of ``generation`` is ended as ``to`` (a grow given up: its newcomers)."""

    task: str
    generation: int
    to: WorkerPhase


@dataclass(frozen=True)
class Stopping:
    """The plan stops the task's generation at a step boundary to relaunch it: the task is down
    from now (unless a failure took it down earlier), with no failure counted."""

    task: str


@dataclass(frozen=True)
class HostStore:
    """Serve the task's rendezvous store, on ``port`` if it is free (0: any), and keep the port
    it serves on with the task: what its workers' environment names (a store already served
    stays where it is). Carried out before the launch that names it is decided."""

    task: str
    port: int


@dataclass(frozen=True)
class TellStore:
    """Tell ``nodes`` (where the task's workers and spares are) that its store moved from port
    ``moved_from`` to ``address``: their agents write it where the workers look."""

    task: str
    moved_from: int
    address: str
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class Launched:
    """A generation of ``workers`` launched from a checkpoint is the task's current one; its
    workers find the task's store on ``port``."""

    task: str
    generation: int
    workers: int
    port: int


Effect = (
    Record
    | TaskDown
    | StopWorker
    | StopGeneration
    | Isolate
    | Switch
    | Launch
    | UseSpare
    | Resized
    | EndWorkers
    | Stopping
    | HostStore
    | TellStore
    | Launched
)

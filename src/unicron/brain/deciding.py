"""What one failure decides, as a value: a pure function of the task, its open incidents, the
ladder's counts and a snapshot of the cluster.

The first failure of a generation opens its incident: the ladder asks for a tier
(``core/ladder.py``) and :func:`~unicron.brain.response.respond` finds the cheapest one
at or above it that applies, with its effects. A failure of the same event (a worker killed with
the first, that had not reached the generation the incident re-formed, which has trained no step
yet) widens that incident: its tier again, without the newly failed ranks, and nothing counted.
Any other failure of a generation with an incident is part of it; one of a task that runs no
generation (stopping to relaunch, waiting) is a sign only.

:func:`decide` changes nothing: ``recovery.py`` carries the decision out (the ladder's counts,
the incident's records, the effects through the applier), and tests check it on hand-built
values.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum

from unicron.brain.records import TaskRecord
from unicron.brain.response import Failure, Response, respond
from unicron.brain.snapshot import Snapshot
from unicron.core.ladder import Decision as LadderDecision
from unicron.core.ladder import Ladder
from unicron.core.settings import Settings
from unicron.core.states import TaskState
from unicron.core.taxonomy import TAXONOMY, ErrorKind, Scope
from unicron.core.tiers import Tier


@dataclass
class Incident:
    id: int
    kind: ErrorKind
    detected: float
    tiers: list[Tier]  # every tier carried out, in order: the last is under way
    generation: int = 0  # the generation it struck (its key in ``Recovery.incidents``)
    formed: int | None = None  # the generation its tier re-formed in place, while none trained
    deadline: float | None = None  # a recovery in place must regain a step by then
    stuck_nodes: set[str] = field(default_factory=set)  # where members stuck in a recovery ran

    @property
    def tier(self) -> Tier:
        return self.tiers[-1]

    def labels(self) -> list[str]:
        return [t.label for t in self.tiers]


@dataclass(frozen=True)
class Seen:
    """A failure as reported: where, which ranks are known gone (``failure``), its kind, the scope
    it is attributed to (``attribution.py``), and the generation the failing worker had reached
    (None: not known)."""

    failure: Failure
    kind: ErrorKind
    scope: Scope
    generation: int | None = None


@dataclass(frozen=True)
class Facts:
    """What the task's spec and state say that a decision reads: whether it recovers in place
    (``in_process``), whether newcomers are joining it (``growing``: given up when an incident
    opens), which sizes it can train at, and its replica size."""

    in_process: bool
    growing: bool
    usable: Callable[[int], bool]
    replica_size: int = 1


class Passed(Enum):
    """A failure that decides nothing: a sign only."""

    INACTIVE = "no generation runs (stopping to relaunch, or waiting)"
    ANSWERED = "the generation's open incident answers it"


@dataclass(frozen=True)
class Opened:
    """The generation's incident opens: the tier the ladder asked for, and the response."""

    asked: LadderDecision
    response: Response


@dataclass(frozen=True)
class Widened:
    """More of ``incident``'s event: its tier carried out again on the generation it formed."""

    incident: Incident
    asked: LadderDecision
    response: Response


FailureDecision = Opened | Widened | Passed


def same_event(
    task: TaskRecord, generation: int | None, incidents: Sequence[Incident], window: float, now: float
) -> Incident | None:
    """The open incident a failure belongs to, if it is the same event: that incident's tier
    re-formed the task's current generation in place, which has trained no step yet, within
    ``window`` (``task_fault_window_s``) of its detection, and the failing worker had not reached
    that generation (``generation``: the newest it reached; None, not known). Every worker killed
    at once reports its exit on its own, and each lands in the generation the previous one's
    recovery formed: without this, one event was counted as many incidents (a healthy node
    isolated for its errors, the task failed as the same fault repeated)."""
    if task.state is not TaskState.STARTING or (generation is not None and generation >= task.generation):
        return None
    for incident in incidents:
        if incident.formed == task.generation and now - incident.detected <= window:
            return incident
    return None


def decide(
    task: TaskRecord,
    seen: Seen,
    incidents: Sequence[Incident],
    ladder: Ladder,
    read: Callable[[], Snapshot],
    facts: Facts,
    limits: Settings,
    now: float,
) -> FailureDecision:
    """What ``seen`` decides for ``task``, given its open ``incidents`` (any generation), the
    ladder's counts and the snapshot ``read`` returns (the task, every node, the isolations
    running: read only for a decision that responds, a copy of every node being dear at scale)."""
    if not task.state.active:
        return Passed.INACTIVE
    same = same_event(task, seen.generation, incidents, limits.task_fault_window_s, now)
    if same is not None:
        why = f"the same event as incident {same.id}"
        asked = LadderDecision(seen.kind, TAXONOMY[seen.kind].severity, same.tier, False, why, seen.scope)
        may_stay = facts.in_process and not facts.growing
        return Widened(same, asked, _respond(read(), seen, asked, may_stay, facts, limits, now))
    if any(i.generation == task.generation for i in incidents):
        return Passed.ANSWERED
    asked = ladder.decide(task.name, seen.kind, seen.failure.node, now, seen.scope)
    # (a grow under way is given up as the incident opens: the task may recover in place)
    return Opened(asked, _respond(read(), seen, asked, facts.in_process, facts, limits, now))


def _respond(
    snapshot: Snapshot,
    seen: Seen,
    asked: LadderDecision,
    may_stay: bool,
    facts: Facts,
    limits: Settings,
    now: float,
) -> Response:
    return respond(snapshot, seen.failure, asked, may_stay, facts.usable, limits, now, facts.replica_size)

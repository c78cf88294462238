"""What the coordinator keeps beside its rows: typed records, one per concept, validated when a
coordinator reads them back (a successor after a takeover, or itself after a restart).

Each record names its entry in the store (``NAME``) and holds plain typed fields: an entry that
does not validate is an error naming the entry, not a ``KeyError`` deep in a restore.
"""

from __future__ import annotations

from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from unicron.core.errors import SpecError
from unicron.core.protocol import Membership
from unicron.core.taxonomy import ErrorKind
from unicron.core.tiers import Tier


class Kept(BaseModel):
    """A record kept in the store under ``NAME``."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    NAME: ClassVar[str]


K = TypeVar("K", bound=Kept)


def kept_name(kind: type[Kept], of: str | None = None) -> str:
    """The store entry of ``kind``'s record (``of``: the one record of that task or node)."""
    return kind.NAME if of is None else f"{kind.NAME}/{of}"


def read_kept(kind: type[K], raw: Any) -> K | None:
    """The record ``raw`` (as the store returned it; None: never kept) holds, validated."""
    if raw is None:
        return None
    try:
        return kind.model_validate(raw)
    except ValidationError as exc:
        raise SpecError(
            f"the store's kept entry {kind.NAME!r} is not a valid {kind.__name__}: {exc}"
        ) from exc


class TaskLadder(Kept):
    """What the severity ladder counts of one task (kept ``of`` it): the tiers carried out, its
    failures, and per kind the same task or storage fault and each incident decided."""

    NAME: ClassVar[str] = "ladder"
    actions: list[tuple[float, Tier]] = []
    failures: list[float] = []
    same: list[tuple[ErrorKind, list[float]]] = []
    decided: list[tuple[ErrorKind, list[float]]] = []


class NodeErrors(Kept):
    """The errors the severity ladder counted against one node (kept ``of`` it), towards its
    isolation: (when, task, kind)."""

    NAME: ClassVar[str] = "node_errors"
    errors: list[tuple[float, str, ErrorKind]] = []


class FaultSigns(Kept):
    """One task's recent signs of faults and the kinds found to be its own (kept ``of`` it;
    ``control/recover/attribution.py``): a successor attributes the next sign as its
    predecessor would."""

    NAME: ClassVar[str] = "signs"
    recent: list[tuple[float, ErrorKind, str | None, int | None]] = []  # time, kind, node, generation
    task_faults: list[tuple[ErrorKind, list[float]]] = []


class DeviceMends(Kept):
    """Per node, when wrong numbers of one of its ranks were undone in the step, within the
    ladder's window (``control/detect/mends.py``): a successor takes a device that keeps
    computing wrong values out as its predecessor would."""

    NAME: ClassVar[str] = "mends"
    seen: dict[str, list[float]] = {}


class MeasuredRates(Kept):
    """The throughput measured per task and worker count, in use by the planner
    (``control/place/rates.py``)."""

    NAME: ClassVar[str] = "rates"
    used: dict[str, dict[int, float]] = {}  # FLOP/s
    samples: dict[str, dict[int, float]] = {}  # samples/s, of tasks whose FLOPs per sample are unknown


class StepTimes(Kept):
    """Each task's recent step intervals, which judge hangs (``control/detect/detection.py``)."""

    NAME: ClassVar[str] = "step_times"
    tasks: dict[str, list[float]] = {}


class OpenIncident(BaseModel):
    """An incident not yet closed, as recovery holds it (``control/recover/recovery.py:Incident``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    id: int
    task: str
    kind: ErrorKind
    detected: float
    tiers: list[Tier]  # every tier carried out, in order: the last is under way
    generation: int  # the generation it struck
    formed: int | None = None  # the generation its tier re-formed in place, while none trained
    stuck_nodes: list[str] = []


class OpenIncidents(Kept):
    """The incidents not yet closed (a successor carries each on from its tier, rather than
    reading them back from the event log's words)."""

    NAME: ClassVar[str] = "incidents"
    incidents: list[OpenIncident] = []


class Isolations(Kept):
    """Until when each isolated node stays out (``control/recover/recovery.py``; None: until an
    operator resumes it)."""

    NAME: ClassVar[str] = "isolations"
    until: dict[str, float | None] = {}


class LossesHeld(Kept):
    """An admin's hold on node losses (``control/detect/silence.py``): while it is on, no silent
    node is declared lost (say, through a planned network change); ``reason`` is theirs."""

    NAME: ClassVar[str] = "losses_held"
    held: bool = False
    reason: str = ""
    since: float = 0.0


class GrowInFlight(BaseModel):
    """A grow whose newcomers were launched and have not joined yet
    (``brain/membership.py:Growth``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    task: str
    generation: int  # the generation the newcomers joined
    membership: Membership  # posted to the live members once every newcomer is ready
    newcomers: list[int]  # their ranks in that generation
    since: float  # when they were launched (the launch time-out counts from it)


class Leaving(BaseModel):
    """A worker a planned shrink let go, leaving by itself at its next step boundary; one still
    running at ``due`` is stopped."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    task: str
    generation: int
    rank: int
    due: float


class InFlight(Kept):
    """Membership changes under way (``control/recover/generations.py``): a successor lets the
    newcomers of a grow in when they are ready, or gives the grow up with a reason, and stops a
    leaver that outstays its deadline, rather than forgetting either."""

    NAME: ClassVar[str] = "in_flight"
    grows: list[GrowInFlight] = []
    leaving: list[Leaving] = []


class StorageIncident(BaseModel):
    """A checkpoint tier refusing a task's checkpoints while it trains on from memory
    (``control/recover/storagewatch.py``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    task: str
    tier: str  # the checkpoint tier refusing (``persistent``, or the worker's tier name)
    incident: int  # the incident's event id (its outcome names it)
    since: float  # when the tier began refusing


class StorageIncidents(Kept):
    """The storage incidents not yet closed: a successor closes each when its tier takes a
    checkpoint again, with how long nothing was persisted."""

    NAME: ClassVar[str] = "storage"
    open: list[StorageIncident] = []


class RevokedToken(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    jti: str
    role: str | None = None
    sub: str | None = None


class RevokedTokens(Kept):
    """Tokens refused from now on, at every coordinator that leads."""

    NAME: ClassVar[str] = "revoked_tokens"
    tokens: list[RevokedToken] = []


class Posted(Kept):
    """What the coordinator posted in one live task's rendezvous store (key -> value, oldest
    first), posted again by a successor in the store it re-creates (``control/act/effects.py``).
    One record per task (kept ``of`` the task): a post rewrites its own task's, not every task's
    (with 100 tasks that was most of a worker crash's handling time)."""

    NAME: ClassVar[str] = "posted"
    keys: dict[str, str] = {}

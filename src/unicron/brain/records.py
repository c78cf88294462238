"""Typed records of the coordinator's store: what a row of each table holds.

Records are frozen snapshots; to change one, call a named operation of :class:`Store`.
``row`` is a record as a backend keeps it (states as their values) and ``of`` reads it back.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from unicron.core.states import NodeState, TaskState, WorkerPhase

_NEW = object.__new__  # (``WorkerRecord._copy``)


@dataclass(frozen=True)
class TaskRecord:
    name: str
    spec: str  # the submitted spec, JSON
    state: TaskState
    generation: int
    workers: int
    step: int
    checkpoint_step: int
    store_port: int
    failures: int
    restarts: int
    down_since: float | None  # when the task last stopped making progress
    downtime_s: float
    samples: int
    flop: float  # weighted FLOP achieved: progress only, not steps trained again (WAF x time)
    digest: str | None
    submitted: float
    started: float | None
    finished: float | None
    reason: str | None  # why it failed, when it did
    launched_generation: int  # the last generation started afresh (not re-formed in place)
    redo_until: int  # the step reached before that launch: steps up to it are trained again
    # The how-many-th task of this name: a name whose task ended may be submitted again, and the
    # ended one is kept as NAME#RUN (``Store.replace_task``). Its generations start after the
    # earlier runs' (``first_generation``), so no worker identity is ever used twice.
    run: int = 1
    first_generation: int = 1
    # When the failure that took the task down began (its fault, else its first sign): its
    # downtime counts from then, detection included, until the first step completed after it.
    # ``down_since`` is when the coordinator took it down (what a stop's wait counts from).
    down_from: float | None = None

    def downtime(self, now: float) -> float:
        """The task's downtime at ``now``: what ended, and the current stretch if it is down
        (one figure for status, the dashboard and the metrics)."""
        return self.downtime_s + (max(0.0, now - self.down_from) if self.down_from is not None else 0.0)

    def final_state_saved(self, iterations: int) -> bool:
        """Whether the task's result is known saved: rank 0 reported the final state's digest, or
        a checkpoint of the last step was persisted."""
        return self.digest is not None or self.checkpoint_step >= iterations

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> TaskRecord:
        return cls(**{**dict(row), "state": TaskState(row["state"])})


@dataclass(frozen=True)
class NodeRecord:
    id: int
    name: str
    slots: int
    gpus: list[str]
    host: str
    state: NodeState
    last_seen: float
    probe_port: int = 0  # its agent's peer-probe listener on ``host`` (0: none)
    domain: str | None = None  # its failure domain (a rack, a switch), if its agent named one
    # An admin's drain holds (it outlasts a loss: the node comes back draining, ``drained_across``).
    drained: bool = False

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> NodeRecord:
        gpus = row["gpus"]  # JSON text in SQLite, a list in etcd's JSON value
        listed = json.loads(gpus) if isinstance(gpus, str) else list(gpus)
        state, drained = NodeState(row["state"]), bool(row.get("drained", False))  # (SQLite: 0 or 1)
        return cls(**{**dict(row), "state": state, "gpus": listed, "drained": drained})


def drained_across(node: NodeRecord, to: NodeState) -> bool:
    """Whether an admin's drain still holds once ``node`` moves to ``to``: it begins with the drain,
    lasts while the node is lost (a drained node rebooted for its maintenance comes back drained,
    as Slurm keeps ``state=drain`` across a reboot), and ends when it is resumed."""
    held = node.drained or node.state is NodeState.DRAINING
    return to is NodeState.DRAINING or (to is NodeState.LOST and held)


@dataclass(frozen=True)
class WorkerRecord:
    task: str
    generation: int
    rank: int
    node: str
    local_rank: int
    state: WorkerPhase
    pid: int | None
    exit_code: int | None
    exit_signal: int | None
    launched: float
    # A newcomer let in by a grow that has not yet taken the live members' state: it holds only
    # what it loaded from a checkpoint until its generation trains a step (it takes the state
    # from them first). Survivors made only of such workers cannot go on in place.
    joining: bool = False

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> WorkerRecord:
        joining = bool(row.get("joining", False))  # (SQLite: 0 or 1)
        return cls(**{**dict(row), "state": WorkerPhase(row["state"]), "joining": joining})

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.task, self.generation, self.rank)

    def in_state(self, to: WorkerPhase) -> WorkerRecord:
        """The same worker in phase ``to``."""
        made = self._copy()
        made.__dict__["state"] = to
        return made

    def in_generation(self, generation: int, rank: int, now: float) -> WorkerRecord:
        """The same process running as ``rank`` of ``generation`` from ``now`` (a switch in place)."""
        made = self._copy()
        made.__dict__.update(
            generation=generation, rank=rank, state=WorkerPhase.RUNNING, exit_code=None, exit_signal=None,
            launched=now,
        )  # fmt: skip
        return made

    def as_rank(self, rank: int, local_rank: int) -> WorkerRecord:
        """The same worker as ``rank`` on local slot ``local_rank``."""
        made = self._copy()
        made.__dict__.update(rank=rank, local_rank=local_rank)
        return made

    def _copy(self) -> WorkerRecord:
        """A copy made without the frozen dataclass's guarded set-up (a checked assignment per
        field, three times the time): a generation's switch makes two rows per worker, hundreds
        in a large task, on the coordinator's loop, and a simulated 16,384-GPU task's view holds
        16,384 of them at each failure. ``tests/test_store.py`` checks that the methods that
        change a copy make what ``replace`` makes."""
        made = _NEW(WorkerRecord)
        made.__dict__.update(self.__dict__)
        return made

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "state": self.state.value}


@dataclass(frozen=True)
class EventRecord:
    id: int
    time: float
    kind: str
    task: str | None
    node: str | None
    detail: dict[str, Any]

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> EventRecord:
        detail = row["detail"]
        return cls(**{**dict(row), "detail": json.loads(detail) if isinstance(detail, str) else dict(detail)})

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def row(record: TaskRecord | NodeRecord | WorkerRecord) -> dict[str, Any]:
    """The record's fields as plain values, as a backend stores them: its state (each record's
    one field that is not a plain value: ``tests/test_store.py`` checks) as its value. Read from
    the instance's own dictionary: a generation's switch writes a row per worker, hundreds in a
    large task, on the coordinator's loop."""
    return {**record.__dict__, "state": record.state.value}

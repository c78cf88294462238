"""Checkpoint commits fenced by generation: only a member of the task's current generation
commits a checkpoint.

A host cut off from the coordinator is declared lost, and its task goes on without it: in place,
or relaunched from its checkpoint on other nodes. Its own workers do not know: if the whole
world of the task was on that side (a task on one node, or a group of nodes cut off together),
their collectives still work, and once their store calls give up they train on, writing
checkpoints into the shared folder that the task's new generation writes too. That is split
brain on storage: two lineages committing the same steps, and a later resume taking whichever
wrote last.

So a checkpoint is written in full, then committed (renamed into place, ``latest`` moved) only
after the writer has confirmed, with the coordinator's store, that it still belongs to the
task's current generation: the coordinator writes that generation (``core.protocol.current_key``,
signed with the task's key) at every launch and every change of membership. The writer reads it
over a connection of its own with a short timeout (the worker's usual store connection may be
blocked in a call to a host that no longer answers), and follows the memberships posted since
its own generation: a worker carried into the current one by in-place changes is still a
member. The answer is one of:

- ``CURRENT``: commit;
- ``SUPERSEDED``: the task went on without this worker (it was declared failed, left, or the
  task was relaunched): commit nothing, and stop;
- ``UNKNOWN``: the store did not answer (a partition, or the coordinator is down), or did not
  say within the time allowed: commit nothing now; a periodic checkpoint is skipped (the next one
  tries again, and every replica still holds the state), the final one is retried like a storage
  fault (``persisting.py``).

Anyone who reaches the store's port can delete or replay its values (it has no authentication;
signing stops forgeries only). So a missing value, or a current generation older than the
writer's own (an old value replayed), is read as "ask again", never as "refused": the coordinator
puts back what it posted within a second (``control/act/rendezvous.py``), and the writer asks
again until its time is up. The memberships that follow a generation are read before the current
generation, and each is written once under a name of its own, so a replayed old current
generation does not make a worker the task went on without current; and "relaunched without this
worker" needs the last launch to be newer than the worker's generation (``protocol.Current``),
which no replayed old value says of a member of the current lineage.

The check and the rename are two steps, so a writer confirmed just before its host is cut off
may still commit that one checkpoint, of a step its generation did reach; nothing later.

The ranks of a sharded replica write a checkpoint together (and retry the final one together),
so they take one answer: the committing rank's, shared in one collective over the replica.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from enum import StrEnum
from typing import Any

from unicron.core.protocol import Current, Membership, current_key, membership_key
from unicron.core.signing import opened
from unicron.core.workerenv import addresses
from unicron.train import storeaddress
from unicron.train.asking import Asker, Unanswered

MAX_HOPS = 64  # far more changes of membership than can pass between two checkpoints


class Standing(StrEnum):
    CURRENT = "current"
    SUPERSEDED = "superseded"
    UNKNOWN = "unknown"


WORST_LAST = (Standing.CURRENT, Standing.UNKNOWN, Standing.SUPERSEDED)  # a replica takes its worst


class CommitRefused(Exception):
    """A checkpoint was written but not committed: its writer is not (known to be) a member of
    the task's current generation. Not a storage fault (the storage took the file)."""

    def __init__(self, standing: Standing, generation: int, step: int) -> None:
        self.standing = standing
        why = (
            "the task went on without this worker"
            if standing is Standing.SUPERSEDED
            else "the task's store did not answer"
        )
        super().__init__(f"checkpoint of step {step} not committed by generation {generation}: {why}")


ASK_AGAIN_S = 0.2  # a value missing or stale in the store is asked for again this often


def standing(
    generation: int, rank: int, current: Current | None, following: Callable[[int], Membership | None]
) -> Standing:
    """Whether ``rank`` of ``generation`` belongs to the task's ``current`` generation (None: the
    store did not say). ``following(g)`` is the membership posted after generation ``g`` (None:
    none is there: ``g`` is current, the task was relaunched from a checkpoint instead, or the
    membership was deleted). UNKNOWN where the store's values do not settle it (missing, or
    older than the worker: ask again)."""
    for _ in range(MAX_HOPS):
        posted = following(generation)
        if posted is not None:
            if rank in posted.failed or rank not in posted.ranks:
                return Standing.SUPERSEDED
            generation, rank = posted.generation, posted.ranks[rank]
            continue
        if current is None or current.generation < generation:
            return Standing.UNKNOWN  # not posted yet, deleted, or an old value replayed
        if current.generation == generation:
            return Standing.CURRENT
        if generation < current.launched:
            return Standing.SUPERSEDED  # relaunched from a checkpoint without this worker
        return Standing.UNKNOWN  # newer in place, yet no membership leads there: one was deleted
    return Standing.UNKNOWN


def served(address: str, timeout_s: float) -> bool:
    """Whether something listens at ``address`` (a store nobody serves refuses at once)."""
    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
        return True
    except OSError:
        return False


def read_standing(
    address: str, task: str, key: str, generation: int, rank: int, timeout_s: float
) -> Standing:
    """``standing`` as the task's store says it (at the first of the comma-separated ``address``
    that is served), over a connection of its own that waits at most about ``timeout_s`` for
    each answer; values missing or stale are asked for again until ``timeout_s`` has passed.
    Values not signed with the task's ``key`` count as absent."""
    import torch.distributed as dist

    deadline = time.monotonic() + timeout_s
    answering = [a for a in addresses(address) if served(a, min(1.0, timeout_s))]
    if not answering:  # a store nobody serves (no coordinator leads now): do not wait for it
        return Standing.UNKNOWN
    host, port = answering[0].rsplit(":", 1)  # (a coordinator that does not lead keeps it closed)
    try:
        raw: Any = dist.TCPStore(  # type: ignore[attr-defined]
            host, int(port), is_master=False, timeout=timedelta(seconds=timeout_s)
        )
    except Exception:  # cannot connect: a partition, or the coordinator is down
        return Standing.UNKNOWN

    def signed(name: str) -> str | None:
        return opened(key, name, raw.get(name)) if raw.check([name]) else None

    def following(g: int) -> Membership | None:
        payload = signed(membership_key(task, g))
        return None if payload is None else Membership.model_validate_json(payload)

    while True:
        try:
            value = signed(current_key(task))
            current = None if value is None else Current.model_validate_json(value)
            now = standing(generation, rank, current, following)
        except Exception:  # the store stopped answering meanwhile
            return Standing.UNKNOWN
        if now is not Standing.UNKNOWN or time.monotonic() + ASK_AGAIN_S > deadline:
            return now
        time.sleep(ASK_AGAIN_S)  # missing or stale: the coordinator puts its value back


@dataclass
class Fence:
    """One worker's checkpoint commits, confirmed with its task's store at ``address`` (``key``:
    the task's store key) within ``timeout_s``. ``where()`` is the worker's (generation, rank,
    step) now; ``worst(code)`` the largest code over its sharded replica (one collective; the
    code itself without a replica). Without a store (a world of one run without an agent, or
    under torchrun) nothing is fenced."""

    address: str
    task: str
    key: str
    timeout_s: float
    where: Callable[[], tuple[int, int, int]]
    worst: Callable[[int], int]
    store_file: str | None = None  # where its agent says the store moved (``storeaddress.py``)
    confirmed_at: int | None = None  # the step whose commit was last confirmed (both tiers use it)
    asker: Asker = field(init=False)

    def __post_init__(self) -> None:
        # A store that does not answer at all (a paused coordinator: ``asking.py``) would hold the
        # step past ``timeout_s``: its answer is waited for that long, and a second past it.
        self.asker = Asker(self.timeout_s + 1.0, "commit-checks")

    def confirm(self) -> None:
        """Raise ``CommitRefused`` unless this worker belongs to the current generation."""
        if self._settled():
            return
        self._settle(self._read())

    def confirm_in_replica(self, commit: bool) -> None:
        """The same for every rank of a sharded replica, called by all of them together: the
        committing rank (``commit``) asks the store, and all take its answer."""
        if self._settled():
            return
        mine = WORST_LAST.index(self._read()) if commit else 0
        try:
            agreed = WORST_LAST[self.worst(mine)]
        except Exception:  # a replica-mate died: nothing is committed
            agreed = Standing.UNKNOWN
        self._settle(agreed)

    def _settled(self) -> bool:
        return not (self.address and self.key) or self.confirmed_at == self.where()[2]

    def _read(self) -> Standing:
        generation, rank, _ = self.where()
        address = ",".join(storeaddress.current(self.address, self.store_file))
        try:
            return self.asker.ask(
                lambda: read_standing(address, self.task, self.key, generation, rank, self.timeout_s)
            )
        except Unanswered:
            return Standing.UNKNOWN

    def _settle(self, found: Standing) -> None:
        generation, _, step = self.where()
        if found is not Standing.CURRENT:
            raise CommitRefused(found, generation, step)
        self.confirmed_at = step

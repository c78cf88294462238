"""Replicas of several ranks (``run.replica_size: K``): how a rank finds its replica and its
data-parallel peers, how a replica's samples are dealt to its ranks, and how its gradients are
summed.

Rank r of a generation is shard position ``r % K`` of replica ``r // K`` (the coordinator keeps
a replica's ranks contiguous and whole: brain/membership.py:whole_replicas). Two groups per rank:

- the replica's own: torch.distributed's default group, of the K ranks, which FSDP shards over.
  It is formed once, when the replica forms, and kept for the replica's life: the coordinator
  takes a replica out whole when any of its ranks fails, so a live replica's group never loses
  a member, and FSDP keeps referring to it across generations.
- the peers: the rank at the same shard position in every replica, a standalone gloo group
  formed per generation (``Peers``). Gradients (each rank's shard, summed over its replica by
  FSDP's reduce-scatter) are summed over it; state is agreed and sent over it shard by shard.

A failure of another replica shows in the peers' collective only, where the session can abandon
it; the replica's ranks then check together that every shard's sum arrived before any of them
writes it back (``reduce``), so that a replica never has some shards at one step and some at
the next.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from unicron.train.data import shard, unclaimed_share
from unicron.train.gradsync import flat_gradients, local, wait_or_abandon, write_back
from unicron.train.iteration import PeerLostError
from unicron.train.peers import Peers, form_default_group


@dataclass(frozen=True)
class Layout:
    """Where rank ``rank`` of a world of ``world`` sits with replicas of ``size`` ranks."""

    rank: int
    world: int
    size: int

    @property
    def replica(self) -> int:
        return self.rank // self.size

    @property
    def position(self) -> int:
        return self.rank % self.size

    @property
    def replicas(self) -> int:
        return self.world // self.size


def micro_batches(replica_ids: list[int], position: int, size: int, micro: int) -> list[list[int]]:
    """The micro-batches of the rank at ``position`` of a replica that trains on ``replica_ids``.
    FSDP makes a replica's ranks run each forward and backward together, so every rank gets the
    same number: rounds of ``size`` micro-batches of ``micro`` samples, the last round's samples
    dealt evenly; a rank left without samples in it gets an empty micro-batch (padding that
    counts nothing: ``sharded.weigh_outputs`` weighs it 0)."""
    per_round = size * micro
    rounds = -(-len(replica_ids) // per_round)
    out = [replica_ids[r * per_round + position * micro :][:micro] for r in range(rounds - 1)]
    if rounds:
        out.append(replica_ids[(rounds - 1) * per_round :][position::size])
    return out


def replica_share(ids: list[int], replica: int, replicas: int) -> list[int]:
    """A replica's samples of a step in a generation that formed at its boundary."""
    return shard(ids, replica, replicas)


def settle(replica: Peers, peers: Peers, ids: list[int], held: list[int]) -> tuple[list[int], list[int]]:
    """After a generation formed: which of the step's samples each replica already holds (what
    any of its ranks accumulated: their sums are one after the replica's reduction), and this
    replica's share of the rest. Returns the share and how many samples each replica held."""
    union = sorted({i for part in replica.gather_lists(held) for i in part})
    holdings = peers.gather_lists(union)
    return unclaimed_share(ids, holdings, peers.rank, peers.size), [len(p) for p in holdings]


def form_replica(
    base: Any, task: str, generation: int, layout: Layout, backend: str, timeout: timedelta
) -> None:
    """The replica's group, as torch.distributed's default group (what FSDP shards over)."""
    prefix = f"{task}/g{generation}/replica{layout.replica}"
    store = dist.PrefixStore(prefix, base)  # type: ignore[attr-defined]
    rank, size = layout.position, layout.size
    form_default_group(backend, store, rank, size, timeout)


def form_peers(base: Any, task: str, generation: int, layout: Layout, timeout: timedelta) -> Peers:
    """This generation's peers of the rank: the same shard position in every replica."""
    prefix = f"{task}/g{generation}/peers{layout.position}"
    return Peers.standalone_gloo(base, prefix, layout.replica, layout.replicas, timeout)


def reduce(
    model: torch.nn.Module,
    sharded: bool,
    replica: Peers,
    peers: Peers,
    abandoned: Callable[[], bool] | None,
    scale: float,
) -> None:
    """Sum the step's gradients: over the replica (FSDP's reduce-scatter did it already for a
    sharded model; a whole model is summed here), then over the peers; the sums are written
    back only once every rank of the replica has its own, so a replica stays at one step."""
    if sharded and peers.size == 1:  # one replica: FSDP's reduce-scatter summed it all
        with torch.no_grad():
            for p in model.parameters():
                if p.grad is not None and scale != 1.0:
                    local(p.grad).mul_(scale)
        return
    grads, flat = flat_gradients(model, scale)
    if not sharded:  # replica-mates fail only with the replica: nothing to abandon it for
        wait_or_abandon(replica.all_reduce_async(flat), replica, None)
    failure: Exception | None = None
    try:
        wait_or_abandon(peers.all_reduce_async(flat), peers, abandoned)
    except Exception as exc:  # told to the replica first
        failure = exc
    all_or_none(replica, failure)
    write_back(grads, flat)


def all_or_none(replica: Peers, failure: Exception | None) -> None:
    """Raise unless every rank of the replica has its sums (``failure`` is this rank's error)."""
    if replica.max(int(failure is not None)):
        raise failure or PeerLostError("another shard of this replica lost its peers: the step is redone")

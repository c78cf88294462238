"""The ranks of a sharded replica take a stop request and a planned membership change at the
same step boundary (``Groups.replica_agrees``), on real gloo processes: one rank asked to stop
makes both stop; a rank whose mate died says yes to everything (it then finds itself in no
later membership)."""

from __future__ import annotations

import multiprocessing as mp
from datetime import timedelta

import torch.distributed as dist

from unicron.train.groups import Groups
from unicron.train.peers import Peers

from .spawned import run_ranks


def _rank(rank: int, port: int, out: mp.Queue) -> None:  # type: ignore[type-arg]
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timedelta(seconds=30))  # type: ignore[attr-defined]
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=timedelta(seconds=10))
    groups = Groups("t", 2, timedelta(seconds=10))
    groups.replica = Peers.world()
    # (membership posted, asked to stop): only rank 1 got the SIGTERM, only rank 0 saw the post.
    agreed = groups.replica_agrees(rank == 0, rank == 1)
    alone = groups.replica_agrees(False, False)
    dist.barrier()
    if rank == 1:
        out.put((rank, [agreed, alone, None]))
        return  # dies without another collective
    mate_gone = groups.replica_agrees(False, False)
    out.put((rank, [agreed, alone, mate_gone]))


def test_a_replica_stops_and_changes_membership_together() -> None:
    results = run_ranks(_rank, 2)
    assert results[0][:2] == results[1][:2] == [(True, True), (False, False)]
    assert results[0][2] == (True, True)
    assert Groups("t", 1, timedelta(seconds=1)).replica_agrees(False, True) == (False, True)

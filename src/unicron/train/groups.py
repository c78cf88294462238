"""A worker's process groups across generations: its data-parallel peers (re-formed every
generation) and, with replicas of several ranks, its replica's own group (formed once, kept for
the replica's life: ``replicas.py``)."""

from __future__ import annotations

import contextlib
import gc
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from unicron.train import devices, membership, replicas
from unicron.train.peers import Peers
from unicron.train.replicas import Layout


class Groups:
    def __init__(self, task: str, replica_size: int, timeout: timedelta, backend: str = "gloo") -> None:
        self.task, self.size, self.timeout = task, replica_size, timeout
        self.backend = backend  # the task's and the replica's groups (``devices.backend``)
        self.peers: Peers | None = None  # this generation's data-parallel peers
        self.replica: Peers | None = None  # the replica's own group (replicas of several ranks)
        self.layout: Layout | None = None
        self._places: list[tuple[str, int]] | None = None  # (node, local rank) of each replica rank
        self._saver: Any = None  # the replica's group for checkpoints written in the background

    @property
    def replicated(self) -> bool:
        """Replicas of several ranks: peers are one rank per replica."""
        return self.size > 1

    def join(self, store: Any, generation: int, rank: int, world: int) -> None:
        """Form this generation's groups (the replica's, the first time)."""
        if not self.replicated:
            opened = membership.join(store, self.task, generation, rank, world, self.timeout, self.backend)
            self.peers = Peers.world(opened)
            return
        layout = Layout(rank, world, self.size)
        if self.replica is None:
            replicas.form_replica(store, self.task, generation, layout, self.backend, self.timeout)
            self.replica = Peers.world()
        elif self.layout is not None and layout.position != self.layout.position:
            raise RuntimeError(
                f"rank {self.layout.rank} became rank {rank}: another shard position of its replica "
                f"(replicas of {self.size}); the coordinator must keep replicas whole and in order"
            )
        self.layout = layout
        self.peers = replicas.form_peers(store, self.task, generation, layout, self.timeout)

    def leave(self) -> None:
        """Leave this generation's peers (``Peers.leave``; the replica's group stays: a live
        replica keeps it). Collected first, so that nothing else still refers to their group (a
        failed collective's frames)."""
        peers, self.peers = self.peers, None
        gc.collect()
        if peers is not None:
            peers.leave()
        elif not self.replicated and dist.is_initialized():  # a default group no peers hold
            with contextlib.suppress(Exception):  # leaving anyway
                dist.destroy_process_group()

    def mesh(self) -> Any:
        """The replica's device mesh, for ``fully_shard(module, mesh=...)``; None with replicas of
        one rank (nothing to shard over)."""
        if not self.replicated or self.replica is None:
            return None
        from torch.distributed.device_mesh import DeviceMesh

        device = "cuda" if devices.uses_nccl(self.backend) else "cpu"
        replica = dist.group.WORLD
        assert replica is not None
        return DeviceMesh.from_group(replica, device)

    def replica_agrees(self, *mine: bool) -> tuple[bool, ...]:
        """Whether any rank of the replica says so, for each of ``mine`` (one collective);
        without a replica, ``mine``. Its ranks must take a planned membership change, and a
        request to stop, at the same step boundary: FSDP runs each forward and backward on all
        of them together (a rank that stopped alone would leave its mates in an all-gather). A
        replica that cannot tell (a rank of it died) says yes to all: its ranks then find
        themselves in no later membership."""
        if self.replica is None:
            return mine
        try:
            return tuple(bool(v) for v in self.replica.maxima([int(m) for m in mine]))
        except Exception:  # a dead replica-mate: the replica is out anyway
            return tuple(True for _ in mine)

    def replica_worst(self, mine: int) -> int:
        """The largest of the replica's ``mine`` (one collective); without a replica, ``mine``."""
        return mine if self.replica is None else self.replica.maxima([mine])[0]

    def replica_on_one_node(self, node: str, local_rank: int) -> bool:
        """Whether the replica's ranks are all on this node, this rank's replica being the
        node's first (its first rank has local rank 0): the replica that keeps the node's
        in-memory checkpoint. Asked once per replica (its ranks never move)."""
        if self.replica is None:
            return local_rank == 0
        if self._places is None:
            places: list[Any] = [None] * self.size
            dist.all_gather_object(places, (node, local_rank))
            self._places = [(str(n), int(r)) for n, r in places]
        return len({n for n, _ in self._places}) == 1 and self._places[0][1] == 0

    def saver(self) -> Any:
        """A gloo group of its own over the replica's ranks, for the thread that writes a
        checkpoint in the background (``backgroundsave.py``): formed by the replica's ranks
        together at their first such checkpoint, kept for the replica's life."""
        if self._saver is None:
            self._saver = dist.new_group(backend="gloo", timeout=self.timeout)
        return self._saver

    def close(self) -> None:
        """Shut every group down while the interpreter still runs: a gloo group destroyed during
        its teardown (still referenced then) can abort the process as it exits."""
        peers, self.peers = self.peers, None
        if peers is not None and peers.standalone:
            with contextlib.suppress(Exception):
                peers.group.shutdown()
        gc.collect()
        if dist.is_available() and dist.is_initialized():
            with contextlib.suppress(Exception):  # leaving anyway
                dist.destroy_process_group()

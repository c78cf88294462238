"""The data-parallel peers of a rank: the group its gradients are summed over and its state is
agreed in, as one object.

With replicas of one rank (``run.replica_size: 1``) the peers are the whole task: the default
process group of the generation. With replicas of K ranks, FSDP owns the default group (the
replica's K ranks, formed once per replica: ``replicas.py``) and the peers of shard position s
are the rank at position s in every replica: a standalone gloo group per generation, which
Unicron alone uses and can abandon while a collective on it is pending (a peer replica failed)
without touching the replica's own group.

Every collective here goes through the process group object's own methods, so the same code
serves a registered group and a standalone one.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from unicron.train import connections, devices
from unicron.train.connections import Opened


@dataclass
class Peers:
    group: Any  # a torch ProcessGroup
    rank: int
    size: int
    backend: str
    standalone: bool  # not registered with torch.distributed (a replica's cross group)
    opened: Opened = field(default_factory=frozenset)  # its connections, cut when it is let go

    @classmethod
    def world(cls, opened: Opened = frozenset()) -> Peers:
        """The default process group (replicas of one rank), which opened ``opened``."""
        group = dist.group.WORLD
        return cls(group, dist.get_rank(), dist.get_world_size(), str(dist.get_backend()), False, opened)

    @classmethod
    def standalone_gloo(cls, store: Any, prefix: str, rank: int, size: int, timeout: timedelta) -> Peers:
        """A gloo group of its own over ``store`` under ``prefix`` (formed by all ``size`` ranks)."""
        scoped = dist.PrefixStore(prefix, store)  # type: ignore[attr-defined]
        group, opened = connections.opened_by(lambda: dist.ProcessGroupGloo(scoped, rank, size, timeout))
        return cls(group, rank, size, "gloo", True, opened)

    @property
    def usable(self) -> bool:
        """False once the default group was destroyed under this object (a ``break`` fault)."""
        return self.standalone or (dist.is_initialized() and dist.group.WORLD is self.group)

    @property
    def nccl(self) -> bool:
        """Its collectives run on NCCL: ``wait`` does not block the host, and ``abandon``
        aborts the communicator (a standalone group is gloo, even on GPUs)."""
        return devices.uses_nccl(self.backend) and not self.standalone

    # ------------------------------------------------------------------ collectives
    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        out = [torch.empty_like(tensor) for _ in range(self.size)]
        self.group.allgather([out], [tensor]).wait()
        return out

    def broadcast(self, tensor: torch.Tensor, source: int) -> None:
        options = dist.BroadcastOptions()
        options.rootRank, options.rootTensor = source, 0
        self.group.broadcast([tensor], options).wait()

    def max(self, value: int) -> int:
        return self.maxima([value])[0]

    def maxima(self, values: list[int]) -> list[int]:
        """Each of ``values``' maximum over the peers, in one collective."""
        tensor = torch.tensor(values, dtype=torch.int64)
        self.maximum_of(tensor)
        return [int(v) for v in tensor]

    def maximum_of(self, tensor: torch.Tensor) -> None:
        """Each element of ``tensor`` becomes its maximum over the peers, in place."""
        self.maximum_of_async(tensor).wait()

    def maximum_of_async(self, tensor: torch.Tensor) -> Any:
        """As ``maximum_of``; returns the pending work."""
        return self.group.allreduce([tensor], self._op(dist.ReduceOp.MAX))

    def all_reduce_async(self, tensor: torch.Tensor) -> Any:
        """Sum ``tensor`` over the peers in place; returns the pending work."""
        return self.group.allreduce([tensor], self._op(dist.ReduceOp.SUM))

    def gather_lists(self, mine: list[int]) -> list[list[int]]:
        """Every peer's list of integers (lengths may differ)."""
        lengths = self.all_gather(torch.tensor([len(mine)], dtype=torch.int64))
        longest = max(int(n[0]) for n in lengths)
        padded = torch.zeros(longest, dtype=torch.int64)
        padded[: len(mine)] = torch.tensor(mine, dtype=torch.int64)
        rows = self.all_gather(padded)
        return [row[: int(n[0])].tolist() for row, n in zip(rows, lengths, strict=True)]

    @staticmethod
    def _op(op: Any) -> Any:
        options = dist.AllreduceOptions()
        options.reduceOp = op
        return options

    # ------------------------------------------------------------------ leaving
    def leave(self) -> None:
        """Let this group go, this rank done with it (a new membership follows): its connections
        cut, so peers still waiting on this rank learn at once that it has gone (a group still
        referenced, by a collective's ``Work`` for one, keeps them open: ``connections.py``);
        unregistered from torch.distributed; and ended on a thread of its own
        (``end_in_background``), as gloo's destructor can wait out the group's timeout. An NCCL
        group is destroyed as torch provides."""
        connections.cut(self.opened)
        if self.nccl:
            with contextlib.suppress(Exception):  # leaving anyway
                dist.destroy_process_group()
            return
        if not self.standalone:
            if not self.usable:
                return  # destroyed under this object already (a ``break`` fault)
            unregister_default_group()
        holder, self.group = [self.group], None
        end_in_background(holder)

    def abandon(self) -> None:
        """Drop this group while a collective on it may still be pending (a peer may never
        answer). A gloo group cannot be aborted (its ``abort`` leaves a blocked operation
        blocked: docs/pytorch-notes.md) and destroying it can block on the pending collective's
        transport, so it is kept alive, never destroyed (one leaked group per abandonment). An
        NCCL group is aborted instead, as torch provides for exactly this: a leaked communicator
        would keep its pending kernel on the GPU stream (the abort and a group formed after it
        ran on a GPU at a world of one, ``bench/nccl_check.py``; with a peer dead under a pending
        kernel it has not: docs/gpu.md)."""
        if self.nccl:
            dist.distributed_c10d._abort_process_group(self.group)
            return
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(self.group))  # never freed, not even at exit
        if not self.standalone:
            unregister_default_group()
        # Its connections cut: its peers learn at once that it has gone (``connections.py``).
        connections.cut(self.opened)


def end_in_background(holder: list[Any]) -> None:
    """Drop the last reference to the group in ``holder`` (unregistered, its connections cut) on
    a thread of its own. A gloo group's destructor joins its worker thread, which first finishes
    the collective it is running: one was seen (gdb) blocked in ``UnboundBuffer::waitRecv`` of a
    ring all-reduce with every connection of the group shut down, holding a survivor of a lost
    node in ``destroy_process_group`` for over 20 s, past the recovery's deadline, so that its
    healthy node was isolated. Only the group's timeout ends such a wait. Here it holds no one:
    the rank forms its next group meanwhile, and the thread ends with the group."""
    threading.Thread(target=holder.clear, name="unicron-group-end", daemon=True).start()


def form_default_group(backend: str, store: Any, rank: int, world: int, timeout: timedelta) -> None:
    """torch.distributed's default group, formed over ``store``. Torch names it (and prefixes its
    keys in the store) by a counter that each group formed advances and only the default group's
    destruction resets. A formation that fails (a member lost on the way) leaves the counter
    advanced with no group to destroy: this rank's next group would be named one ahead of its
    peers', and each would wait for the others' addresses under its own prefix until the group's
    timeout. (Seen under load: two survivors of a member killed while their group formed both
    waited in ``connectFullMesh`` past the recovery's deadline, and the task went back to its
    checkpoint.) So a failed formation puts the counter back."""
    try:
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
    except BaseException:
        if not dist.is_initialized():
            dist.distributed_c10d._world.group_count = 0
        raise


def unregister_default_group() -> None:
    """Forget torch.distributed's default group (and every group derived from it) without
    touching it: the caller keeps it alive (``Peers.abandon``) or ends it (``Peers.leave``)."""
    c10d = dist.distributed_c10d
    if c10d.GroupMember.WORLD is None:
        return
    c10d._update_default_pg(None)
    world = c10d._world
    for table in (
        world.pg_map,
        world.pg_names,
        world.pg_group_ranks,
        world.pg_backend_config,
        world.pg_to_tag,
        world.tags_to_pg,
        world.pg_coalesce_state,
    ):
        table.clear()
    c10d._unregister_all_process_groups()  # type: ignore[attr-defined]
    world.group_count = 0

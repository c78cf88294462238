"""Nearest-state recovery: the in-memory checkpoint tier, and the same-node replica preference.

The tier choice runs on files; the replica choice runs three real gloo processes on loopback.
"""

from __future__ import annotations

import multiprocessing as mp
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from unicron.control.localcluster import free_port
from unicron.train import checkpoint, membership


def model_at(value: float) -> torch.nn.Module:
    m = torch.nn.Linear(3, 2)
    with torch.no_grad():
        for p in m.parameters():
            p.fill_(value)
    return m


def state_of(m: torch.nn.Module, step: int) -> dict[str, object]:
    return {"model": m.state_dict(), "optimizer": {}, "step": step, "digest": checkpoint.digest(m)}


def test_the_nodes_in_memory_copy_is_used_when_newest_and_intact(tmp_path: Path) -> None:
    persistent, root = tmp_path / "ckpt", tmp_path / "shm"
    root.mkdir()
    host = checkpoint.host_dir(persistent, "node-0", str(root))
    assert host is not None and host != checkpoint.host_dir(persistent, "node-1", str(root))
    checkpoint.save(persistent, 10, state_of(model_at(1.0), 10))
    checkpoint.save(host, 10, state_of(model_at(1.0), 10))
    found = checkpoint.load_nearest(persistent, host)
    assert found is not None and found[1] == "host_memory" and found[0]["step"] == 10
    # An older in-memory copy loses to a newer persistent checkpoint.
    checkpoint.save(persistent, 20, state_of(model_at(2.0), 20))
    found = checkpoint.load_nearest(persistent, host)
    assert found is not None and (found[1], found[0]["step"]) == ("persistent", 20)
    # A newer copy whose parameters do not match its digest is not trusted.
    bad = state_of(model_at(3.0), 30)
    bad["digest"] = "0" * 16
    checkpoint.save(host, 30, bad)
    found = checkpoint.load_nearest(persistent, host)
    assert found is not None and (found[1], found[0]["step"]) == ("persistent", 20)
    assert checkpoint.load_nearest(tmp_path / "none", None) is None


def _member(rank: int, port: int, out: mp.Queue) -> None:  # type: ignore[type-arg]
    store = dist.TCPStore("127.0.0.1", port, 3, rank == 0, timedelta(seconds=30))  # type: ignore[attr-defined]
    dist.init_process_group("gloo", store=store, rank=rank, world_size=3)
    # Ranks 0 and 1 hold step 7; rank 2 (a newcomer on node-b, like rank 1) holds nothing.
    model = model_at(7.0 if rank < 2 else 0.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    node = "node-a" if rank == 0 else "node-b"
    agreed = membership.agree(model, optimizer, 7 if rank < 2 else 0, node)
    out.put((rank, agreed, checkpoint.digest(model)))
    dist.destroy_process_group()


def test_a_member_behind_takes_state_from_a_replica_on_its_node() -> None:
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    port = free_port()
    procs = [ctx.Process(target=_member, args=(r, port, out)) for r in range(3)]
    for p in procs:
        p.start()
    results = {rank: (agreed, digest) for rank, agreed, digest in (out.get(timeout=120) for _ in procs)}
    for p in procs:
        p.join(60)
    assert {r[0].step for r in results.values()} == {7}
    assert len({r[1] for r in results.values()}) == 1  # every member holds the same parameters
    newcomer = results[2][0]
    assert newcomer.received and newcomer.source == 1 and newcomer.same_node
    assert not results[0][0].received

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
    return checkpoint.state_of(m, torch.optim.SGD(m.parameters(), lr=0.1), step)


def test_the_nodes_in_memory_copy_is_used_when_newest_and_intact(tmp_path: Path) -> None:
    persistent, root = tmp_path / "ckpt", tmp_path / "shm"
    root.mkdir()
    host = checkpoint.host_dir(persistent, "node-0", str(root))
    assert host is not None and host != checkpoint.host_dir(persistent, "node-1", str(root))
    checkpoint.save(persistent, 10, state_of(model_at(1.0), 10))
    checkpoint.save(host, 10, state_of(model_at(1.0), 10))
    found = checkpoint.load_nearest(persistent, host)
    assert found is not None and (found.source, found.state["step"], found.skipped) == ("host_memory", 10, ())
    # An older in-memory copy loses to a newer persistent checkpoint.
    checkpoint.save(persistent, 20, state_of(model_at(2.0), 20))
    found = checkpoint.load_nearest(persistent, host)
    assert found is not None and (found.source, found.state["step"]) == ("persistent", 20)
    # A newer copy whose parameters do not match its digest is not trusted, and is named.
    bad = state_of(model_at(3.0), 30)
    bad["state_digest"] = "0" * 16
    checkpoint.save(host, 30, bad)
    found = checkpoint.load_nearest(persistent, host)
    assert found is not None and (found.source, found.state["step"]) == ("persistent", 20)
    assert found.skipped == ((str(checkpoint.path_for(host, 30)), "does not match its digest"),)
    assert checkpoint.load_nearest(tmp_path / "none", None) is None
    # A checkpoint written before the whole-state digest existed is checked by its parameters.
    old = state_of(model_at(4.0), 40)
    del old["state_digest"]
    checkpoint.save(persistent, 40, old)
    found = checkpoint.load_nearest(persistent, host)
    assert found is not None and (found.source, found.state["step"]) == ("persistent", 40)


def test_a_torn_newest_checkpoint_falls_back_to_the_next_newest_in_any_tier(tmp_path: Path) -> None:
    persistent, root = tmp_path / "ckpt", tmp_path / "shm"
    root.mkdir()
    host = checkpoint.host_dir(persistent, "node-0", str(root))
    assert host is not None
    for step in (10, 20):
        checkpoint.save(persistent, step, state_of(model_at(float(step)), step))
    checkpoint.save(host, 20, state_of(model_at(20.0), 20))
    for path in (checkpoint.path_for(persistent, 20), checkpoint.path_for(host, 20)):
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])  # torn: the write never finished
    found = checkpoint.load_nearest(persistent, host)
    assert found is not None and (found.source, found.state["step"]) == ("persistent", 10)
    assert [why.split(":")[0] for _, why in found.skipped] == ["unreadable", "unreadable"]
    assert found.report("lm", 2, 0).skipped == list(found.skipped)
    model = model_at(0.0)
    model.load_state_dict(found.state["model"])
    assert checkpoint.digest(model) == checkpoint.digest(model_at(10.0))


def test_the_state_digest_covers_the_optimizer() -> None:
    model = model_at(1.0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    before = checkpoint.state_digest(model, optimizer)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    after = checkpoint.state_digest(model, optimizer)
    # The moments alone: same parameters, different optimizer state, a different digest.
    other = torch.optim.AdamW(model.parameters(), lr=0.1)
    assert len({before, after, checkpoint.state_digest(model, other)}) == 3
    optimizer.state_dict()["state"][0]["exp_avg"].view(-1)[0] += 1.0
    assert checkpoint.state_digest(model, optimizer) != after


def _member(rank: int, port: int, out: mp.Queue, damaged: int = 0) -> None:  # type: ignore[type-arg]
    store = dist.TCPStore("127.0.0.1", port, 3, rank == 0, timedelta(seconds=30))  # type: ignore[attr-defined]
    dist.init_process_group("gloo", store=store, rank=rank, world_size=3)
    # Ranks 0 and 1 hold step 7; rank 2 (a newcomer on node-b, like rank 1) holds nothing.
    model = model_at(7.0 if rank < 2 else 0.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    node = "node-a" if rank == 0 else "node-b"
    damage = iter([rank == 2] * damaged)  # the newcomer's first ``damaged`` receipts arrive damaged
    try:
        agreed: membership.Agreement | str = membership.agree(
            model, optimizer, 7 if rank < 2 else 0, node, lambda: next(damage, False)
        )
    except RuntimeError as exc:
        agreed = str(exc)
    out.put((rank, agreed, checkpoint.digest(model)))
    dist.destroy_process_group()


def agree_among_three(damaged: int = 0) -> dict[int, tuple[membership.Agreement | str, str]]:
    """Rank -> (its agreement, or the error it raised; its parameters' digest after)."""
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    port = free_port()
    procs = [ctx.Process(target=_member, args=(r, port, out, damaged)) for r in range(3)]
    for p in procs:
        p.start()
    results = {rank: (agreed, digest) for rank, agreed, digest in (out.get(timeout=120) for _ in procs)}
    for p in procs:
        p.join(60)
    return results


def test_a_member_behind_takes_state_from_a_replica_on_its_node() -> None:
    results = agree_among_three()
    agreements = {r: a for r, (a, _) in results.items() if isinstance(a, membership.Agreement)}
    assert {a.step for a in agreements.values()} == {7} and len(agreements) == 3
    assert len({d for _, d in results.values()}) == 1  # every member holds the same parameters
    newcomer = agreements[2]
    assert newcomer.received and newcomer.source == 1 and newcomer.same_node and not newcomer.rejected
    assert not agreements[0].received


def test_a_damaged_transfer_is_rejected_and_taken_again_from_another_replica() -> None:
    results = agree_among_three(damaged=1)
    newcomer, digest = results[2]
    assert isinstance(newcomer, membership.Agreement)
    # The nearest replica's state arrived damaged: refused by its digest, taken from rank 0.
    assert newcomer.rejected == (1,) and newcomer.source == 0 and not newcomer.same_node
    assert digest == results[0][1] == checkpoint.digest(model_at(7.0))
    # When every source's transfer is damaged, nobody loads anything: the members all fail.
    results = agree_among_three(damaged=2)
    assert all(isinstance(a, str) and "failed its digest check" in a for a, _ in results.values())
    assert results[2][1] == checkpoint.digest(model_at(0.0))

"""Nearest-state recovery: the in-memory checkpoint tier, and the same-node replica preference.

The tier choice runs on files; the replica choice runs three real gloo processes on loopback.
"""

from __future__ import annotations

import multiprocessing as mp
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from unicron.core.workerenv import host_checkpoint_dir
from unicron.train import checkpoint, membership
from unicron.train.fingerprint import ReplicasDiverged
from unicron.train.peers import Peers
from unicron.train.session import Session
from unicron.train.state import StateMismatch, TrainState

from .spawned import run_ranks


def model_at(value: float) -> torch.nn.Module:
    m = torch.nn.Linear(3, 2)
    with torch.no_grad():
        for p in m.parameters():
            p.fill_(value)
    return m


def state_of(m: torch.nn.Module, step: int) -> dict[str, object]:
    return checkpoint.state_of(TrainState(m, torch.optim.SGD(m.parameters(), lr=0.1)), step)


def scheduled(value: float, steps: int) -> TrainState:
    """A model at ``value`` with an optimizer and a registered LR scheduler stepped ``steps`` times."""
    model = model_at(value)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
    for _ in range(steps):
        optimizer.step()
        scheduler.step()
    return TrainState(model, optimizer, {"scheduler": scheduler})


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


class Payload:
    """What a writer of the shared directory could put in a checkpoint: unpickling it runs code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (print, (f"ran code while loading {self.marker}",))


def test_a_checkpoint_carrying_code_is_passed_over_without_running_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    persistent = tmp_path / "ckpt"
    checkpoint.save(persistent, 10, state_of(model_at(10.0), 10))
    planted = {**state_of(model_at(20.0), 20), "extra": Payload(tmp_path)}
    torch.save(planted, checkpoint.path_for(persistent, 20))
    found = checkpoint.load_nearest(persistent, None)
    assert found is not None and found.state["step"] == 10
    assert [why for _, why in found.skipped] == ["unreadable: UnpicklingError"]
    assert "ran code" not in capsys.readouterr().out
    torch.load(checkpoint.path_for(persistent, 20), weights_only=False)  # what it would have done
    assert "ran code" in capsys.readouterr().out


def test_the_state_digest_covers_the_optimizer() -> None:
    model = model_at(1.0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    before = TrainState(model, optimizer).digest()
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    after = TrainState(model, optimizer).digest()
    # The moments alone: same parameters, different optimizer state, a different digest.
    other = torch.optim.AdamW(model.parameters(), lr=0.1)
    assert len({before, after, TrainState(model, other).digest()}) == 3
    optimizer.state_dict()["state"][0]["exp_avg"].view(-1)[0] += 1.0
    assert TrainState(model, optimizer).digest() != after


def test_registered_objects_are_in_the_digest_and_the_checkpoint(tmp_path: Path) -> None:
    three, four = scheduled(1.0, 3), scheduled(1.0, 4)
    assert three.digest() != four.digest()  # the scheduler's position alone differs
    assert three.digest() == scheduled(1.0, 3).digest()
    checkpoint.save(tmp_path, 3, checkpoint.state_of(three, 3))
    found = checkpoint.load_nearest(tmp_path, None)
    assert found is not None
    fresh = scheduled(0.0, 0)
    fresh.load_state_dict(found.state)
    assert fresh.digest() == three.digest()
    restored = fresh.extras["scheduler"]
    assert isinstance(restored, torch.optim.lr_scheduler.StepLR) and restored.last_epoch == 3
    assert fresh.optimizer.param_groups[0]["lr"] == 0.05  # halved once, at the third step
    # A damaged scheduler state is caught by the whole-state digest like any other part.
    bad = checkpoint.state_of(four, 4)
    bad["extras"]["scheduler"]["last_epoch"] = 40
    checkpoint.save(tmp_path, 4, bad)
    found = checkpoint.load_nearest(tmp_path, None)
    assert found is not None and found.state["step"] == 3 and len(found.skipped) == 1


def test_a_state_saved_with_other_registered_objects_is_refused_by_name(tmp_path: Path) -> None:
    saved = checkpoint.state_of(scheduled(1.0, 3), 3)
    model = model_at(0.0)
    plain = TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(
        StateMismatch, match=r"holds objects \['scheduler'\] but this program registered \[\]"
    ):
        plain.load_state_dict(saved)
    assert checkpoint.digest(plain.model) == checkpoint.digest(model_at(0.0))  # nothing loaded


def _member(rank: int, port: int, out: mp.Queue, damaged: int = 0) -> None:  # type: ignore[type-arg]
    store = dist.TCPStore("127.0.0.1", port, 3, rank == 0, timedelta(seconds=30))  # type: ignore[attr-defined]
    dist.init_process_group("gloo", store=store, rank=rank, world_size=3)
    # Ranks 0 and 1 hold step 7 (their scheduler stepped 7 times); rank 2 (a newcomer on
    # node-b, like rank 1) holds nothing.
    train = scheduled(7.0, 7) if rank < 2 else scheduled(0.0, 0)
    node = "node-a" if rank == 0 else "node-b"
    damage = iter([rank == 2] * damaged)  # the newcomer's first ``damaged`` receipts arrive damaged
    try:
        agreed: membership.Agreement | str = membership.agree(
            Peers.world(), train, 7 if rank < 2 else 0, node, lambda: next(damage, False)
        )
    except RuntimeError as exc:
        agreed = str(exc)
    scheduler = train.extras["scheduler"]
    assert isinstance(scheduler, torch.optim.lr_scheduler.StepLR)
    out.put((rank, (agreed, f"{checkpoint.digest(train.model)} {train.digest()} {scheduler.last_epoch}")))
    dist.destroy_process_group()


def agree_among_three(damaged: int = 0) -> dict[int, tuple[membership.Agreement | str, str]]:
    """Rank -> (its agreement, or the error it raised; its parameters' digest after)."""
    return run_ranks(_member, 3, damaged)


def test_a_member_behind_takes_state_from_a_replica_on_its_node() -> None:
    results = agree_among_three()
    agreements = {r: a for r, (a, _) in results.items() if isinstance(a, membership.Agreement)}
    assert {a.step for a in agreements.values()} == {7} and len(agreements) == 3
    # Every member holds the same parameters, optimizer and scheduler (at its 7th step).
    assert len({d for _, d in results.values()}) == 1 and results[2][1].endswith(" 7")
    newcomer = agreements[2]
    assert newcomer.received and newcomer.source == 1 and newcomer.same_node and not newcomer.rejected
    assert not agreements[0].received


def test_a_damaged_transfer_is_rejected_and_taken_again_from_another_replica() -> None:
    results = agree_among_three(damaged=1)
    newcomer, digest = results[2]
    assert isinstance(newcomer, membership.Agreement)
    # The nearest replica's state arrived damaged: refused by its digest, taken from rank 0.
    assert newcomer.rejected == (1,) and newcomer.source == 0 and not newcomer.same_node
    assert digest == results[0][1] and digest.startswith(checkpoint.digest(model_at(7.0)))
    # When every source's transfer is damaged, nobody loads anything: the members all fail.
    results = agree_among_three(damaged=2)
    assert all(isinstance(a, str) and "failed its digest check" in a for a, _ in results.values())
    assert results[2][1] == f"{checkpoint.digest(model_at(0.0))} {scheduled(0.0, 0).digest()} 0"


def _two_at_seven(rank: int, port: int, out: mp.Queue, live: bool) -> None:  # type: ignore[type-arg]
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timedelta(seconds=30))  # type: ignore[attr-defined]
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    train = scheduled(7.0 if rank == 0 else 7.5, 7)  # both at step 7, their parameters unlike
    try:
        membership.agree(Peers.world(), train, 7, f"node-{rank}", live=live)
        out.put((rank, ("agreed", checkpoint.digest(train.model))))
    except ReplicasDiverged as exc:
        out.put((rank, ("diverged", sorted(exc.odd))))
    dist.destroy_process_group()


def test_live_replicas_that_differ_copy_nothing_and_a_launch_shares_one_state_out() -> None:
    """At a launch, ranks may each have initialized their own way: the lowest rank's state is
    shared out (as DDP broadcasts rank 0's). Live replicas re-formed after a recovery trained in
    lockstep: two that differ at the same step copy nothing (either may hold the flipped bit)."""
    launched = run_ranks(_two_at_seven, 2, False)
    assert set(launched.values()) == {("agreed", checkpoint.digest(model_at(7.0)))}
    assert run_ranks(_two_at_seven, 2, True) == {0: ("diverged", [0, 1]), 1: ("diverged", [0, 1])}


@pytest.mark.parametrize("launcher", ["standalone", "torchrun"])
def test_a_run_without_an_agent_keeps_no_copy_in_the_nodes_memory(tmp_path: Path, launcher: str) -> None:
    """No agent frees a node's in-memory copies after a standalone or torchrun run: such runs
    must not write any (found: 4.6 GB of reference runs' copies left in /dev/shm)."""
    env = {"TORCHELASTIC_RUN_ID": "x", "RANK": "0", "WORLD_SIZE": "1"} if launcher == "torchrun" else {}
    session = Session(env, iterations=2, checkpoint_dir=tmp_path)
    loader = session.loader([torch.zeros(2)] * 4, 2, batch_size=2)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in session.steps(model, optimizer):
        for batch in loader:
            model(batch).sum().backward()
        optimizer.step()
        optimizer.zero_grad()  # gradients left for the next step are refused (train/loopguard.py)
    session.close()
    assert session.host_dir is None
    assert (tmp_path / "step-00000002.pt").exists()
    assert not host_checkpoint_dir(tmp_path, session.node).exists()


def test_a_writer_left_behind_cannot_move_latest_back(tmp_path: Path) -> None:
    """A worker cut off from its task (a partitioned host) that saves a step the others have
    passed commits nothing: ``latest`` keeps naming the newer step; a newer step moves it on."""
    state = {"model": {"w": torch.ones(2)}}
    checkpoint.save(tmp_path, 20, {**state, "step": 20})
    stale = checkpoint.save(tmp_path, 10, {**state, "step": 10})
    assert stale.exists()  # written, but not committed
    assert (tmp_path / checkpoint.LATEST).read_text() == checkpoint.path_for(tmp_path, 20).name
    checkpoint.save(tmp_path, 30, {**state, "step": 30})
    assert (tmp_path / checkpoint.LATEST).read_text() == checkpoint.path_for(tmp_path, 30).name

"""Checkpoint commits fenced by generation (train/fencing.py): only a member of the task's
current generation commits. The verdict is decided by hand-built memberships, then read from a
real store served as the coordinator serves it, and a refused commit leaves no file behind."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch

from unicron.control.act.rendezvous import Rendezvous
from unicron.core.protocol import Current, Membership, current_key, membership_key
from unicron.core.signing import derive, sign
from unicron.train import checkpoint
from unicron.train.checkpoint import CheckpointWriteError
from unicron.train.fencing import CommitRefused, Fence, Standing, read_standing, standing
from unicron.train.persisting import Persisting

SECRET = b"f" * 64
KEY = derive(SECRET, "lm")


def chain(*posted: Membership) -> dict[int, Membership]:
    """Memberships by the generation they follow (each ``generation - 1``)."""
    return {m.generation - 1: m for m in posted}


def now(generation: int, launched: int = 1) -> Current:
    return Current(generation=generation, launched=launched)


def test_a_member_carried_into_the_current_generation_may_commit() -> None:
    # 2 -> 3: rank 1 became rank 0 (rank 0 failed); 3 -> 4: a grow kept it as rank 0.
    posted = chain(
        Membership(generation=3, world_size=2, ranks={1: 0, 2: 1}, failed=[0]),
        Membership(generation=4, world_size=3, ranks={0: 0, 1: 1}),
    )
    assert standing(4, 0, now(4), posted.get) is Standing.CURRENT
    assert standing(2, 1, now(4), posted.get) is Standing.CURRENT
    assert standing(3, 1, now(4), posted.get) is Standing.CURRENT


def test_a_worker_the_task_went_on_without_may_not() -> None:
    posted = chain(
        Membership(generation=3, world_size=2, ranks={1: 0, 2: 1}, failed=[0]),
        Membership(generation=4, world_size=1, ranks={0: 0}),  # a planned shrink: rank 1 left
    )
    assert standing(2, 0, now(4), posted.get) is Standing.SUPERSEDED  # declared failed
    assert standing(3, 1, now(4), posted.get) is Standing.SUPERSEDED  # left
    # Relaunched from a checkpoint: no membership follows the old generation at all.
    assert standing(1, 0, now(5, launched=5), {}.get) is Standing.SUPERSEDED
    assert standing(1, 0, now(6, launched=5), {}.get) is Standing.SUPERSEDED  # and re-formed since


def test_a_store_that_says_nothing_confirms_nothing() -> None:
    assert standing(3, 0, None, {}.get) is Standing.UNKNOWN
    assert standing(4, 0, now(3), {}.get) is Standing.UNKNOWN  # a store behind the worker: not yet known


def test_deleted_or_replayed_values_leave_the_standing_unknown_never_wrong() -> None:
    """The store takes deletions and replays from anyone: neither may refuse a member of the
    current lineage (it would stop), nor let in a worker the task went on without."""
    posted = chain(Membership(generation=3, world_size=2, ranks={1: 0, 2: 1}, failed=[0]))
    # Generation 2's rank 1 is generation 3's rank 0, but the membership that says so was deleted.
    assert standing(2, 1, now(3), {}.get) is Standing.UNKNOWN
    # An old current generation replayed: a member of a newer one asks again.
    assert standing(3, 0, now(2), posted.get) is Standing.UNKNOWN
    # ... and a worker declared failed in 2 stays out though the store says 2 is current.
    assert standing(2, 0, now(2), posted.get) is Standing.SUPERSEDED
    # A replayed value from before a relaunch says an older launch: a member still may commit.
    assert standing(5, 0, now(4, launched=1), {}.get) is Standing.UNKNOWN


class Served:
    def __init__(self) -> None:
        self.rendezvous = Rendezvous("127.0.0.1", SECRET)
        self.port = self.rendezvous.host("lm")
        self.address = f"127.0.0.1:{self.port}"

    def standing(self, generation: int, rank: int, timeout_s: float = 5.0) -> Standing:
        return read_standing(self.address, "lm", KEY, generation, rank, timeout_s)

    def current(self, generation: int, launched: int = 1) -> None:
        self.rendezvous.set("lm", current_key("lm"), now(generation, launched).model_dump_json())


def test_the_standing_read_from_the_store_follows_the_coordinator_and_ignores_forgeries() -> None:
    served = Served()
    assert served.standing(1, 0, timeout_s=0.5) is Standing.UNKNOWN  # nothing written yet
    served.current(1)
    assert served.standing(1, 0) is Standing.CURRENT
    shrink = Membership(generation=2, world_size=1, ranks={1: 0}, failed=[0])
    served.rendezvous.set("lm", membership_key("lm", 1), shrink.model_dump_json())
    served.current(2)
    assert served.standing(1, 1) is Standing.CURRENT
    assert served.standing(1, 0) is Standing.SUPERSEDED
    # Anyone who reaches the port can write: an unsigned or foreign value counts as absent.
    import torch.distributed as dist

    raw: Any = dist.TCPStore("127.0.0.1", served.port, is_master=False)  # type: ignore[attr-defined]
    raw.set(current_key("lm"), now(3).model_dump_json())
    assert served.standing(3, 0, timeout_s=0.5) is Standing.UNKNOWN
    raw.set(current_key("lm"), sign(derive(b"x" * 64, "lm"), current_key("lm"), now(3).model_dump_json()))
    assert served.standing(3, 0, timeout_s=0.5) is Standing.UNKNOWN


def test_a_store_nobody_serves_is_unknown_within_the_timeout() -> None:
    served = Served()
    address = served.address
    served.rendezvous.close_all()
    del served
    began = time.monotonic()
    assert read_standing(address, "lm", KEY, 1, 0, 1.0) is Standing.UNKNOWN
    assert time.monotonic() - began < 30  # bounded by the timeout, not the process-group's


def state() -> dict[str, Any]:
    return {"model": {"w": torch.ones(2)}, "step": 0}


def refuse(kind: Standing) -> Any:
    def confirm() -> None:
        raise CommitRefused(kind, 1, 20)

    return confirm


def test_a_refused_commit_leaves_the_last_checkpoint_and_no_file(tmp_path: Path) -> None:
    checkpoint.save(tmp_path, 10, state(), confirm=lambda: None)
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(CommitRefused):
        checkpoint.save(tmp_path, 20, state(), confirm=refuse(Standing.UNKNOWN))
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no step-20 file, not even a .tmp
    assert (tmp_path / "latest").read_text() == "step-00000010.pt"


def test_persisting_skips_an_unconfirmed_commit_and_ends_a_superseded_writer(tmp_path: Path) -> None:
    reported: list[tuple[str, bool]] = []
    refused: list[Standing] = []
    persisting = Persisting(
        lambda tier, ok, error, when: reported.append((tier, ok)),
        sleep=lambda s: None,
        refused=lambda tier, why: refused.append(why.standing),
    )
    unknown = lambda: checkpoint.save(tmp_path, 20, state(), confirm=refuse(Standing.UNKNOWN))  # noqa: E731
    assert persisting.attempt("persistent", unknown) is None
    assert reported == []  # not a storage fault: the storage took the file
    superseded = lambda: checkpoint.save(tmp_path, 20, state(), confirm=refuse(Standing.SUPERSEDED))  # noqa: E731
    with pytest.raises(CommitRefused):
        persisting.attempt("persistent", superseded)
    # The final state: retried while unconfirmed, then the refusal is raised.
    with pytest.raises(CommitRefused):
        persisting.final(unknown, wait_s=3)
    assert refused == [Standing.UNKNOWN, Standing.SUPERSEDED, *[Standing.UNKNOWN] * 4]  # 4 tries, 1 last
    assert not list(tmp_path.iterdir())

    def full() -> Path:
        raise CheckpointWriteError("no space left")

    assert persisting.attempt("persistent", full) is None
    assert reported == [("persistent", False)]  # a storage fault is still reported as one


class ReplicaMax:
    """The replica's collective for two ranks in threads: each gets the larger of the two codes."""

    def __init__(self) -> None:
        self.codes: dict[int, int] = {}
        self.barrier = threading.Barrier(2)

    def worst(self, rank: int) -> Any:
        def agree(code: int) -> int:
            self.codes[rank] = code
            self.barrier.wait(10)
            return max(self.codes.values())

        return agree


def confirm_both(served: Served, step: int) -> list[str]:
    """Both ranks of a replica of generation 1 confirm a commit of ``step`` together; what each
    concluded (a standing refused, or "commit")."""
    shared = ReplicaMax()

    def one(rank: int) -> str:
        fence = Fence(served.address, "lm", KEY, 5.0, lambda: (1, rank, step), shared.worst(rank))
        try:
            fence.confirm_in_replica(commit=rank == 0)
        except CommitRefused as refused:
            return refused.standing.value
        return "commit"

    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(one, [0, 1]))


def test_a_sharded_replica_takes_its_committing_ranks_answer_together() -> None:
    """Only the committing rank asks the store; both ranks conclude alike, so that they retry a
    final checkpoint (a collective write) the same number of times."""
    served = Served()
    served.current(1)
    assert confirm_both(served, 10) == ["commit", "commit"]
    served.current(2, launched=2)  # relaunched: nothing follows generation 1
    assert confirm_both(served, 20) == ["superseded", "superseded"]
    dead = Fence(served.address, "lm", KEY, 5.0, lambda: (2, 0, 30), lambda code: 1 // 0)
    with pytest.raises(CommitRefused) as refused:  # a replica-mate died in the collective
        dead.confirm_in_replica(commit=True)
    assert refused.value.standing is Standing.UNKNOWN


def test_a_deleted_current_generation_is_asked_for_again_until_the_coordinator_puts_it_back() -> None:
    served = Served()
    served.current(2)
    import torch.distributed as dist

    raw: Any = dist.TCPStore("127.0.0.1", served.port, is_master=False)  # type: ignore[attr-defined]
    raw.delete_key(current_key("lm"))
    put_back = threading.Timer(1.0, served.rendezvous.restore, args=("lm",))
    put_back.start()
    try:
        assert served.standing(2, 0, timeout_s=10.0) is Standing.CURRENT
    finally:
        put_back.cancel()

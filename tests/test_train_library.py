"""The training library's pure parts: data positions and micro-batch weights, classification."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, DistributedSampler

from unicron.control.recover.recovery import CONSEQUENCES
from unicron.core.classify import classify, classify_exception
from unicron.core.taxonomy import ErrorKind
from unicron.train import gradsync
from unicron.train.data import DataStream, shard, unclaimed_share
from unicron.train.iteration import PeerLostError
from unicron.train.loader import step_data


@given(st.integers(1, 200), st.integers(1, 64), st.booleans(), st.booleans(), st.integers(1, 8))
def test_each_epoch_visits_every_sample_once(
    size: int, batch: int, drop_last: bool, shuffle: bool, world: int
) -> None:
    if drop_last and batch > size:
        with pytest.raises(ValueError, match="fewer than one global batch"):
            DataStream(batch, 1, size, 3, shuffle, drop_last)
        return
    stream = DataStream(batch, 1, size, 3, shuffle, drop_last)
    for epoch in range(2):
        steps = range(epoch * stream.steps_per_epoch + 1, (epoch + 1) * stream.steps_per_epoch + 1)
        seen = [i for step in steps for i in stream.batch(step)]
        assert len(set(seen)) == len(seen) == (size // batch * batch if drop_last else size)
    # Dealing partitions a step's samples, balanced within one sample.
    ids = stream.batch(stream.steps_per_epoch)
    shares = [shard(ids, r, world) for r in range(world)]
    assert sorted(i for s in shares for i in s) == sorted(ids)
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 4),
    st.integers(1, 3),
    st.integers(1, 3),
    st.integers(1, 120),
    st.integers(0, 9),
    st.booleans(),
)
def test_every_rank_sees_what_it_would_under_torchrun_with_distributed_sampler(
    world: int, micro: int, accumulation: int, extra: int, seed: int, shuffle: bool
) -> None:
    """DDP's loop: DistributedSampler(seed, drop_last) + DataLoader(batch_size=micro, drop_last),
    ``accumulation`` micro-batches per optimizer step, set_epoch each epoch. The session's
    deal at the same world size gives every rank the same micro-batches in the same order."""
    global_batch = world * micro * accumulation
    size = global_batch + extra
    stream = DataStream(global_batch, micro, size, seed, shuffle, drop_last=True)
    dataset = list(range(size))
    for epoch in range(2):
        for rank in range(world):
            sampler = DistributedSampler(dataset, world, rank, shuffle=shuffle, seed=seed, drop_last=True)
            sampler.set_epoch(epoch)
            loader = DataLoader(dataset, batch_size=micro, sampler=sampler, drop_last=True)
            ddp = [[int(i) for i in b] for b in loader]
            assert len(ddp) // accumulation == stream.steps_per_epoch
            for k in range(stream.steps_per_epoch):
                share = shard(stream.batch(epoch * stream.steps_per_epoch + k + 1), rank, world)
                ours = [share[j : j + micro] for j in range(0, len(share), micro)]
                assert ours == ddp[k * accumulation : (k + 1) * accumulation]


def test_the_dataset_is_fetched_through_the_users_collate_fn() -> None:
    pairs = [(torch.tensor([float(i)]), i % 3) for i in range(10)]
    data = step_data(pairs, 4, 2, None, 0, False, True)
    inputs, labels = data.fetch([1, 4])
    assert inputs.tolist() == [[1.0], [4.0]] and labels.tolist() == [1, 1]
    custom = step_data(pairs, 4, 2, lambda items: [label for _, label in items], 0, False, True)
    assert custom.fetch(custom.stream.batch(2)) == [1, 2, 0, 1]  # samples 4..7, in order


@pytest.mark.parametrize(
    ("given", "says"),
    [
        (DataLoader(list(range(8)), batch_size=2), "got a DataLoader; pass its dataset and collate_fn"),
        (DistributedSampler(list(range(8)), 2, 0), "got a sampler; pass the dataset"),
        (iter(range(8)), "has no len\\(\\) and indexing"),
    ],
)
def test_a_loader_a_sampler_or_an_iterable_is_refused_with_the_fix(given: object, says: str) -> None:
    with pytest.raises(TypeError, match=says):
        step_data(given, 4, 2, None, 0, True, True)


@pytest.mark.parametrize(
    ("error", "message", "kind"),
    [
        (
            "RuntimeError",
            "CUDA error: an illegal memory access was encountered",
            ErrorKind.ILLEGAL_MEMORY_ACCESS,
        ),
        ("RuntimeError", "CUDA error: uncorrectable ECC error encountered", ErrorKind.ECC_ERROR),
        (
            "RuntimeError",
            "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
            "[127.0.0.1]:9369: Connection reset by peer",
            ErrorKind.CONNECTION_RESET,
        ),
        ("RuntimeError", "Connection closed by peer [127.0.0.1]:5117", ErrorKind.CONNECTION_RESET),
        ("DistStoreError", "Connection refused", ErrorKind.CONNECTION_REFUSED),
        (
            "RuntimeError",
            "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=3, "
            "OpType=ALLREDUCE) ran for 600000 milliseconds before timing out.",
            ErrorKind.NCCL_TIMEOUT,
        ),
        (
            "RuntimeError",
            "Timed out waiting 1800000ms for recv operation to complete",
            ErrorKind.NCCL_TIMEOUT,
        ),
        (
            "RuntimeError",
            "NCCL error in: ProcessGroupNCCL.cpp:1191, unhandled system error, NCCL version 2.18.1",
            ErrorKind.OTHER_NETWORK_ERROR,
        ),
        ("ValueError", "shapes (3,4) and (5,6) not aligned", ErrorKind.USER_ERROR),
        ("ConnectionResetError", "connection to peers broken", ErrorKind.CONNECTION_RESET),
        ("OutOfMemoryError", "CUDA out of memory. Tried to allocate 2.00 GiB", ErrorKind.OUT_OF_MEMORY),
        (
            "RuntimeError",
            "[enforce fail at alloc_cpu.cpp:114] DefaultCPUAllocator: can't allocate memory: "
            "you tried to allocate 1024 bytes. Error code 12 (Cannot allocate memory)",
            ErrorKind.OUT_OF_MEMORY,
        ),
        ("RuntimeError", "something odd", ErrorKind.OTHER),
    ],
)
def test_classification_of_real_messages(error: str, message: str, kind: ErrorKind) -> None:
    assert classify(error, message) is kind


@pytest.mark.parametrize(
    "message",
    [
        "another shard of this replica lost its peers: the step is redone",  # replicas.all_or_none
        gradsync.ABANDONED + "abandoned",  # gradsync.wait_or_abandon
        "this worker was declared failed during the step",  # steploop (the coordinator moved on)
    ],
)
def test_a_lost_peer_is_a_consequence_not_the_raising_ranks_failure(message: str) -> None:
    """A survivor raises PeerLostError for a peer's failure: the coordinator waits for its cause,
    as for a connection error. Classified ``other`` (a failure of its own), it blamed the rank
    that raised it and took that rank's healthy replica out (test_coordinator_logic)."""
    assert classify_exception(PeerLostError(message)) is ErrorKind.CONNECTION_RESET
    assert ErrorKind.CONNECTION_RESET in CONSEQUENCES


def test_the_ledger_shares_out_exactly_what_nobody_holds() -> None:
    """A group re-formed inside a step: one member held its old share, another had seen the new
    membership at the step boundary and held nothing. Together they must cover the step's
    samples exactly once (a shard formula over the departed ranks computed some twice)."""
    ids = list(range(16))
    held = [[], [12, 13, 14, 15]]
    parts = [held[r] + unclaimed_share(ids, held, r, 2) for r in range(2)]
    assert sorted(i for p in parts for i in p) == ids
    assert abs(len(parts[0]) - len(parts[1])) <= 4


class _Saving(torch.nn.Linear):
    """A model with a Hugging Face style ``save_pretrained`` (its configuration and weights)."""

    def save_pretrained(self, folder: Path) -> None:
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
        torch.save(self.state_dict(), folder / "model.bin")


def test_the_final_model_is_exported_whole_replacing_an_older_one_and_only_if_confirmed(
    tmp_path: Path,
) -> None:
    from unicron.train.exporting import checked, export

    target = checked(_Saving(2, 1), tmp_path / "final")
    (target / "stale").mkdir(parents=True)
    export(_Saving(2, 1), target, confirm=lambda: None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final"]  # no partial or previous left
    assert sorted(p.name for p in target.iterdir()) == ["config.json", "model.bin"]

    def refused() -> None:
        raise RuntimeError("superseded")

    with pytest.raises(RuntimeError, match="superseded"):
        export(_Saving(2, 1), tmp_path / "other", confirm=refused)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final"]


@pytest.mark.parametrize(
    ("model", "folder", "says"),
    [
        (torch.nn.Linear(2, 1), "out", "Linear has no save_pretrained"),
        (_Saving(2, 1), ".", "name a folder"),
        (_Saving(2, 1), "..", "name a folder"),
    ],
)
def test_an_export_that_cannot_be_made_is_refused_before_training(
    model: torch.nn.Module, folder: str, says: str
) -> None:
    from unicron.train.exporting import checked

    with pytest.raises((TypeError, ValueError), match=says):
        checked(model, folder)


def test_only_rank_0_exports_and_only_after_the_last_step() -> None:
    from unicron.train.exporting import due, gathers

    assert due(0, 40, 40) and not due(1, 40, 40)
    assert not due(0, 25, 40)  # asked to stop at step 25 of 40: no final model
    # A sharded model is gathered by rank 0's replica (ranks 0 and 1 of replicas of 2) only.
    assert gathers(0, 40, 40, 2) and gathers(1, 40, 40, 2) and not gathers(2, 40, 40, 2)
    assert not gathers(1, 25, 40, 2)

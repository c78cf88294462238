"""The training library's pure parts: data positions and micro-batch weights, classification."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from unicron.core.classify import classify
from unicron.core.taxonomy import ErrorKind
from unicron.train.data import global_batch_ids, shard, unclaimed_share


@given(st.integers(1, 40), st.integers(1, 64), st.integers(1, 200), st.integers(1, 8))
def test_steps_cover_the_stream_without_gaps_or_repeats(
    steps: int, batch: int, size: int, world: int
) -> None:
    seen = [i for step in range(1, steps + 1) for i in global_batch_ids(step, batch, size, seed=3)]
    # Every epoch is a permutation: within each full epoch every sample appears exactly once.
    for epoch in range(len(seen) // size):
        assert sorted(seen[epoch * size : (epoch + 1) * size]) == list(range(size))
    # Sharding partitions a step's samples, and weights make DDP's average the global mean.
    ids = global_batch_ids(steps, batch, size, seed=3)
    shares = [shard(ids, r, world) for r in range(world)]
    assert [i for s in shares for i in s] == ids
    assert all(abs(len(s) - batch / world) < 1 for s in shares)  # balanced within one sample


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


def test_the_ledger_shares_out_exactly_what_nobody_holds() -> None:
    """A group re-formed inside a step: one member held its old share, another had seen the new
    membership at the step boundary and held nothing. Together they must cover the step's
    samples exactly once (a shard formula over the departed ranks computed some twice)."""
    ids = list(range(16))
    held = [[], [12, 13, 14, 15]]
    parts = [held[r] + unclaimed_share(ids, held, r, 2) for r in range(2)]
    assert sorted(i for p in parts for i in p) == ids
    assert abs(len(parts[0]) - len(parts[1])) <= 4

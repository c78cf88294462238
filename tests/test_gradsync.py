"""Overlapped gradient reduction on real gloo processes: buckets launched from the gradient
hooks of the last backward sum to exactly what one flat all-reduce after backward gives, each
weighted by the scale it was given, also
with an unused parameter and a rank that computed nothing; and a failure with buckets in flight
leaves the rank's own gradients as they were; a wait for a late peer asks about failed peers
meanwhile without losing the collective."""

from __future__ import annotations

import multiprocessing as mp
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from unicron.train import gradsync
from unicron.train.peers import Peers

from .spawned import run_ranks


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(4)]).double()
        self.unused = torch.nn.Linear(2, 2).double()  # never in the graph: its bucket is filled at finish

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)  # type: ignore[no-any-return]


def grads_after(rank: int, overlap: bool, micro_batches: int, scale: float) -> dict[str, torch.Tensor]:
    """The gradients after the reduction; with them, under "extra", what a step's metrics
    (``train/metric.py``) reduce beside them: each rank's sum, summed over the ranks, unscaled."""
    model = Net()
    extra = torch.tensor([rank + 1.0, 10.0 * rank], dtype=torch.float64)
    # Several buckets of about one layer each.
    buckets = gradsync.Buckets(model, cap_bytes=3000)
    assert len(buckets.buckets) > 2
    data = torch.randn(8, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(rank))
    for i in range(micro_batches):
        if overlap and i == micro_batches - 1:
            buckets.arm(Peers.world(), scale)
        model(data[i * 2 : i * 2 + 2]).pow(2).sum().backward()
    if overlap:
        if micro_batches == 0:
            buckets.arm(Peers.world(), scale)
        buckets.finish(None, extra)
    else:
        gradsync.all_reduce_gradients(model, Peers.world(), None, scale, extra)
    return {"extra": extra, **{n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}}


def waits_out_a_slow_peer(rank: int) -> bool:
    """Rank 1 joins an all-reduce 0.35 s late; rank 0 waits for it in ``wait_or_abandon``, whose
    timed waits (100 ms each) must leave the collective running between its questions about
    peers: the sum arrives intact, and rank 0 asked more than once."""
    if rank == 1:
        time.sleep(0.35)
    summed, asked = torch.full((1000,), float(rank + 1)), [0]

    def peers_failed() -> bool:
        asked[0] += 1
        return False  # no peer fails here

    gradsync.wait_or_abandon(dist.all_reduce(summed, async_op=True), Peers.world(), peers_failed)
    return bool((summed == 3).all()) and (rank == 1 or asked[0] >= 2)


def _member(rank: int, port: int, out: mp.Queue) -> None:  # type: ignore[type-arg]
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timedelta(seconds=30))  # type: ignore[attr-defined]
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    computed = 0 if rank == 1 else 3  # rank 1 holds no samples this step
    # Weighted by 1/4 in the reduction: a power of two, so the sums scale exactly.
    flat = grads_after(rank, False, computed, 1.0)
    bucketed = grads_after(rank, True, computed, 0.25)
    # A failure with buckets in flight: the local gradients are untouched until the end.
    model = Net()
    buckets = gradsync.Buckets(model, cap_bytes=3000)
    model(torch.ones(2, 16, dtype=torch.float64)).sum().backward()
    local = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    buckets.arm(Peers.world())
    model(torch.ones(2, 16, dtype=torch.float64)).sum().backward()
    buckets.disarm()  # as recovery does when the collective fails
    kept = all(torch.equal(p.grad, 2 * local[n]) for n, p in model.named_parameters() if p.grad is not None)
    kept = kept and waits_out_a_slow_peer(rank)
    dist.barrier()
    # Plain lists, not tensors: a tensor crosses the queue as a handle to this process's memory,
    # gone once it exits (the parent then fails to read it).
    out.put(
        (
            rank,
            (
                {n: t.flatten().tolist() for n, t in flat.items()},
                {n: t.flatten().tolist() for n, t in bucketed.items()},
                kept,
            ),
        )
    )
    dist.destroy_process_group()


def test_buckets_sum_exactly_what_one_flat_all_reduce_sums() -> None:
    results = run_ranks(_member, 2)
    for flat, bucketed, kept in results.values():
        assert flat.keys() == bucketed.keys() and "unused.weight" in bucketed
        assert flat.pop("extra") == bucketed.pop("extra") == [3.0, 10.0]
        for name in flat:
            assert [v / 4 for v in flat[name]] == bucketed[name], name  # float64 values, bit for bit
        assert kept
    assert results[0][1] == results[1][1]  # every rank holds the same sums


def test_a_short_step_in_an_unchanged_group_need_not_ask_whether_it_was_declared_failed() -> None:
    """A peer abandons a collective only after one wait of ``POLL`` in it, begun after this rank
    began the step before: a rank whose step before began less than half of ``POLL`` ago was
    counted by every peer, and skips the store round trip; any other case asks."""
    from unicron.train.steploop import maybe_abandoned

    half = gradsync.POLL.total_seconds() / 2
    began = [(5, 100.0), (5, 100.012)]  # the step before and this one, in generation 5
    assert not maybe_abandoned(2, False, began, 5, 100.0 + half - 0.001)
    assert maybe_abandoned(2, False, began, 5, 100.0 + half + 0.001)  # long enough for a peer to give up
    assert maybe_abandoned(1, False, began, 5, 100.02)  # alone: newcomers go on without asking it
    assert maybe_abandoned(4, True, began, 5, 100.02)  # replicas of several ranks: always asks
    assert maybe_abandoned(2, False, began[1:], 5, 100.02)  # the first step of this loop
    assert maybe_abandoned(2, False, began, 6, 100.02)  # re-formed (generation 6) in this step
    assert maybe_abandoned(2, False, [(4, 100.0), (5, 100.012)], 5, 100.02)  # ... since the step before

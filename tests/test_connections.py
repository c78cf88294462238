"""A gloo group let go while a collective on it is pending (``Peers.abandon``), or left while
something still refers to it (``Peers.leave`` with a collective's ``Work`` held: it keeps the
group's connections open, destroyed or not), has its connections cut: a peer
waiting on this rank learns at once that it has gone, as it would from a dead process, instead of
waiting for the process group's timeout (real processes, a real gloo world of two). And a group
left is ended on a thread of its own, so that its destructor never holds the rank."""

from __future__ import annotations

import multiprocessing as mp
import threading
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from unicron.train import membership
from unicron.train.peers import Peers

from .spawned import run_ranks

TIMEOUT = timedelta(seconds=300)  # the group's own: far longer than the test may take


def _rank(rank: int, port: int, out: mp.Queue, how: str) -> None:  # type: ignore[type-arg]
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timedelta(seconds=60))  # type: ignore[attr-defined]
    opened = membership.join(store, "t", 1, rank, 2, TIMEOUT, "gloo")
    peers = Peers.world(opened)
    held = peers.all_reduce_async(torch.ones(4))
    held.wait()  # the group works
    if rank == 0:  # it goes without taking part: rank 1's sum is pending on it
        store.wait(["summing"])  # rank 1's sum is launched: it can only end when told
        if how == "abandoned":
            peers.abandon()
        else:  # left as survivors leave, with the Work above still held
            peers.leave()
            assert not dist.is_initialized()  # unregistered: the next group can be formed
        store.wait(["told"])
        out.put((rank, how))
        return
    work = peers.all_reduce_async(torch.ones(4))
    store.set("summing", "1")
    try:
        work.wait()
        told = "summed"
    except RuntimeError as exc:
        told = str(exc)[:300]
    store.set("told", "1")
    out.put((rank, told))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["abandoned", "left"])
def test_a_peer_pending_on_a_group_let_go_is_told_at_once(how: str) -> None:
    results = run_ranks(_rank, 2, how)
    assert results[0] == how
    assert "Connection closed by peer" in results[1], results[1]


def test_a_group_left_ends_on_a_thread_of_its_own() -> None:
    """``Peers.leave`` returns while the group's end still waits (gloo's destructor waiting out a
    blocked collective): the end runs on its own thread, and the group is dropped there."""
    release, ended_on = threading.Event(), list[str]()

    class EndsWhenReleased:  # a group whose destructor blocks until released
        def __del__(self) -> None:
            release.wait(60)
            ended_on.append(threading.current_thread().name)

    peers = Peers(EndsWhenReleased(), 0, 2, "gloo", True)
    peers.leave()  # without the thread of its own, this would wait the 60 s, then end here
    assert peers.group is None and not ended_on
    ending = next(t for t in threading.enumerate() if t.name == "unicron-group-end")
    release.set()
    ending.join(30)
    assert ended_on == ["unicron-group-end"]

"""Gradient synchronisation: the sum of every rank's gradients, overlapped with the step's last
backward pass (``Buckets``) or as one flat buffer (after a recovery), and a collective that can
be abandoned when the coordinator posts a recovery (a peer declared failed, or a reattempt).

Both take a ``scale``: the factor that turns what each rank accumulated (the sum of its
micro-batches' gradients) into its share of the step's global mean. It is applied once, to the
buffer being reduced, as DDP's reducer divides its bucket by the world size: never to the
gradients themselves, which stay the rank's own sums until the reduced values are written back,
so a collective that fails leaves them as they were for recovery to reduce again."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
from torch._C._nn import flatten_dense_tensors, unflatten_dense_tensors  # as torch._utils uses them

from unicron.train.iteration import PeerLostError
from unicron.train.numerics import norm
from unicron.train.peers import Peers

POLL = timedelta(milliseconds=100)  # how often a pending collective asks whether a peer failed
ABANDONED = "a recovery was posted (a peer failed, or a reattempt): the pending collective is "
GPU_POLL_S = 0.0002  # between looks at a pending NCCL collective (a CUDA event query each)


def none_abandoned(since_previous_step_began_s: float) -> bool:
    """Whether no peer can have abandoned the step's collectives that this rank just completed,
    given how long ago this rank began the step before (in the same group). A peer abandons a
    collective only after one wait of ``POLL`` in it without completion (``wait_or_abandon``,
    ``_poll_gpu``). Its waits in this step began after it left the previous step's collectives,
    which completed only once every rank had entered them: after this rank began that step. So
    a peer that abandoned waited ``POLL`` after that; and this rank's collectives completed
    within a few milliseconds of the peer's (the same messages end both). Half of ``POLL`` leaves
    that margin. A rank whose steps are this short need not ask the store, after each step,
    whether it was declared failed meanwhile (a round trip per step: ~1% of a tinygpt step): its
    peers counted the step as it did, and it notices the new membership at the boundary."""
    return since_previous_step_began_s < POLL.total_seconds() / 2


def local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``tensor``: its shard of a sharded (DTensor) one, sharing its storage."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if to_local is not None else tensor


def all_reduce_gradients(
    model: torch.nn.Module,
    peers: Peers | None,
    abandoned: Callable[[], bool] | None,
    scale: float = 1.0,
    extra: torch.Tensor | None = None,
    check: Callable[[Callable[[], float]], None] | None = None,
) -> None:
    """Sum the gradients (this rank's shards of them, in a sharded replica) times ``scale`` over
    the peers, as one flat buffer. ``abandoned``: polled while the collective is pending
    (whether the coordinator posted a recovery that abandons the step; None: wait for it,
    however long). ``extra`` (the step's metrics: ``metric.py``) is summed
    in place beside them, and the gradients are written back only once both are. ``check``: given
    the sum's norm (computed only if it asks) before anything is written back, it raises for a
    sum that is wrong (``numerics.WrongSum``: not finite, or a spike; ``replicacheck``'s
    ``StateUnlike``)."""
    if peers is None or not peers.usable:
        raise ConnectionResetError("the process group is gone: connection to peers broken")
    grads, flat = flat_gradients(model, scale)
    works = [peers.all_reduce_async(flat), *([] if extra is None else [peers.all_reduce_async(extra)])]
    for work in works:
        wait_or_abandon(work, peers, abandoned)
    if check is not None:
        check(lambda: norm([flat]))
    write_back(grads, flat)


def flat_gradients(model: torch.nn.Module, scale: float) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The model's gradients (this rank's shards of them; zeros for those backward never
    reached) and a flat copy of them times ``scale``, to reduce; the gradients stay as they are."""
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    grads = [local(p.grad) for p in params if p.grad is not None]
    flat = flatten_dense_tensors(grads)
    if scale != 1.0:
        flat.mul_(scale)
    return grads, flat


def write_back(grads: list[torch.Tensor], flat: torch.Tensor) -> None:
    """Copy the reduced ``flat`` buffer into ``grads`` (as ``flat_gradients`` laid it out), in
    two calls into torch: a Python loop over the parameters cost a tinygpt step ~1% (py-spy)."""
    torch._foreach_copy_(grads, unflatten_dense_tensors(flat, grads))


def wait_or_abandon(work: Any, peers: Peers, abandoned: Callable[[], bool] | None) -> None:
    """Wait for a collective, but abandon it once ``abandoned`` says so: the coordinator posted
    a recovery (a peer declared dead or hung, or a reattempt of a collective stuck with every
    rank alive). A peer whose node went silent without closing its connections (powered off,
    partitioned) would otherwise keep the collective waiting until the process-group timeout,
    many minutes. Only gloo's collectives can be left this way.

    The wait blocks in gloo (the GIL released, woken the moment the collective completes) for at
    most ``POLL`` at a time; a timed-out wait leaves the collective running (torch's
    ``Work.wait(timeout)`` only stops waiting), so between waits the store is asked about peers.
    A sleep-and-poll loop instead costs up to its sleep after every collective, and steals the
    CPU from peers still computing on the same cores. On an NCCL group (``peers.nccl``: CUDA
    tensors), ``wait`` does not block the host (``_poll_gpu``); a standalone gloo group blocks
    as above, whatever device its tensors are on."""
    if abandoned is None:
        work.wait()
        return
    if peers.nccl:
        _poll_gpu(work, peers, abandoned)
        return
    while True:
        try:
            work.wait(timeout=POLL)
            return
        except RuntimeError:
            if work.is_completed():
                break  # done (a timeout that raced completion) or failed: the wait below says
        if abandoned():
            peers.abandon()
            raise PeerLostError(ABANDONED + "abandoned")
    work.wait()  # raises the collective's own error, if it failed


def _poll_gpu(work: Any, peers: Peers, abandoned: Callable[[], bool]) -> None:
    """An NCCL collective: ``wait`` only orders the current CUDA stream after it and returns at
    once, and a kernel whose peer died stays pending on the GPU, so its completion is polled
    (``is_completed`` reads a CUDA event, no synchronisation) while the store is asked about
    peers; a failed peer aborts the communicator (``Peers.abandon``), which ends the kernel."""
    ask_at = time.monotonic() + POLL.total_seconds()  # the store is asked as often as for gloo
    while not work.is_completed():
        if time.monotonic() >= ask_at:
            if abandoned():
                peers.abandon()
                raise PeerLostError(ABANDONED + "aborted")
            ask_at = time.monotonic() + POLL.total_seconds()
        time.sleep(GPU_POLL_S)
    work.wait()


class Buckets:
    """Gradient buckets reduced during the backward pass, as DDP's reducer does: parameters are
    grouped in reverse order (roughly the order backward produces their gradients) into buckets
    of about ``cap_bytes``; once armed (for the step's last micro-batch), a bucket whose
    gradients are all accumulated is copied into its own buffer and all-reduced asynchronously,
    in bucket order on every rank, while backward goes on. ``finish`` launches what is left,
    waits, and writes the sums back. The gradients themselves are only written back at the end,
    so a failure with buckets in flight leaves every rank's local sum intact for recovery."""

    def __init__(self, model: torch.nn.Module, cap_bytes: int = 25 * 2**20) -> None:
        self.model = model
        params = [p for p in model.parameters() if p.requires_grad]
        self.buckets: list[list[torch.nn.Parameter]] = [[]]
        size = 0
        for p in reversed(params):
            if self.buckets[-1] and size + p.numel() * p.element_size() > cap_bytes:
                self.buckets.append([])
                size = 0
            self.buckets[-1].append(p)
            size += p.numel() * p.element_size()
        self.bucket_of = {id(p): i for i, bucket in enumerate(self.buckets) for p in bucket}
        self.armed = False
        self.scale = 1.0  # applied to each bucket's buffer before its all-reduce (see the module)
        self.before_first: Callable[[], None] | None = None  # before the first launch (faults)
        self._reset()
        for p in params:
            p.register_post_accumulate_grad_hook(self._accumulated)  # type: ignore[no-untyped-call]

    @classmethod
    def of(cls, model: torch.nn.Module, existing: Buckets | None) -> Buckets:
        """The model's buckets (made once: their hooks stay on the parameters)."""
        return existing if existing is not None and existing.model is model else cls(model)

    def _reset(self) -> None:
        # The peers are held only while armed: the hooks keep this object for the model's life,
        # and a group still referenced when the interpreter exits can abort it (gloo's threads).
        self.peers: Peers | None = None
        self.ready: list[set[int]] = [set() for _ in self.buckets]
        self.flights: list[tuple[Any, torch.Tensor]] = []  # (work, buffer) per launched bucket
        self.error: Exception | None = None

    def arm(self, peers: Peers, scale: float = 1.0) -> None:
        """The next backward is the step's last: reduce buckets over ``peers`` (the group of
        the current generation), times ``scale``, as they fill."""
        self._reset()
        self.armed, self.scale = peers.usable, scale
        self.peers = peers if self.armed else None

    def disarm(self) -> None:
        """Abandon what is in flight (a failure: the group is being rebuilt)."""
        self.armed = False
        self._reset()

    def _accumulated(self, p: torch.Tensor) -> None:
        if not self.armed or self.error is not None:
            return
        self.ready[self.bucket_of[id(p)]].add(id(p))
        try:
            while len(self.flights) < len(self.buckets) and self._filled(len(self.flights)):
                self._launch(len(self.flights))
        except Exception as exc:  # raised again by finish, where recovery handles it
            self.error = exc

    def _filled(self, index: int) -> bool:
        return len(self.ready[index]) == len(self.buckets[index])

    def _launch(self, index: int) -> None:
        if index == 0 and self.before_first is not None:
            self.before_first()
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.buckets[index]]
        buffer = flatten_dense_tensors(grads)
        if self.scale != 1.0:
            buffer.mul_(self.scale)
        assert self.peers is not None  # armed
        self.flights.append((self.peers.all_reduce_async(buffer), buffer))

    def finish(
        self,
        abandoned: Callable[[], bool] | None,
        extra: torch.Tensor | None = None,
        check: Callable[[Callable[[], float]], None] | None = None,
    ) -> None:
        """Launch the buckets backward did not fill (unused parameters, or a rank with no
        samples), then ``extra`` (summed in place: the step's metrics), wait for all, and write
        the sums back into the gradients (``check``: given the sum's norm first, as
        ``all_reduce_gradients``)."""
        peers = self.peers
        try:
            if self.error is not None:
                raise self.error
            assert peers is not None  # armed
            while len(self.flights) < len(self.buckets):
                self._launch(len(self.flights))
            works = [work for work, _ in self.flights]
            if extra is not None:
                works.append(peers.all_reduce_async(extra))
            for work in works:
                wait_or_abandon(work, peers, abandoned)
            if check is not None:
                flights = self.flights
                check(lambda: norm([buffer for _, buffer in flights]))
            for bucket, (_, buffer) in zip(self.buckets, self.flights, strict=True):
                for p in bucket:
                    if p.grad is None:  # backward never reached it: its gradient is the sum alone
                        p.grad = torch.zeros_like(p)
                write_back([p.grad for p in bucket if p.grad is not None], buffer)
        finally:
            self.disarm()

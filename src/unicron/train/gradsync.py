"""Gradient synchronisation: the sum of every rank's gradients, and a collective that can be
abandoned when a peer is declared failed."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from unicron.train import membership
from unicron.train.iteration import PeerLostError


def all_reduce_gradients(model: torch.nn.Module, peers_failed: Callable[[], bool] | None) -> None:
    """Sum the gradients over the ranks, as one flat buffer. ``peers_failed``: polled while the
    collective is pending (None: wait for it, however long)."""
    if not dist.is_initialized():
        raise ConnectionResetError("the process group is gone: connection to peers broken")
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    grads = [p.grad for p in params if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    work = dist.all_reduce(flat, op=dist.ReduceOp.SUM, async_op=True)
    wait_or_abandon(work, peers_failed)
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def wait_or_abandon(work: Any, peers_failed: Callable[[], bool] | None) -> None:
    """Wait for a collective, but abandon it once ``peers_failed`` says so: a peer was declared
    dead or hung. A peer whose node went silent without closing its connections (powered off,
    partitioned) would otherwise keep the collective waiting until the process-group timeout,
    many minutes. Only gloo's collectives can be left this way."""
    if peers_failed is None or dist.get_backend() != "gloo":
        work.wait()
        return
    pause, checked = 0.0002, time.monotonic()
    while not work.is_completed():
        time.sleep(pause)
        pause = min(pause * 2, 0.005)  # a fast collective pays little for the polling
        now = time.monotonic()
        if now - checked >= 0.1:
            checked = now
            if peers_failed():
                membership.abandon()
                raise PeerLostError("a peer was declared failed: the pending collective is abandoned")
    work.wait()  # raises the collective's own error, if it failed

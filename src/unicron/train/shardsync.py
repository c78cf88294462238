"""The sum of a sharded model's gradients over the replicas, overlapped with the backward pass.

FSDP reduce-scatters each unit's gradients inside the replica as backward reaches it, then
calls the unit's all-reduce hook with the output, whose slices become the unit's sharded
gradients. Armed for the step's last micro-batch, the hook copies that output, scales it and
launches its sum over the peers at once, while backward goes on with the next unit (what
FSDP's own HSDP does with its replicate group). ``finish`` waits for every unit's sum, checks
with the replica's other ranks that all of theirs arrived too, and only then writes the sums
into the outputs, so a failure with sums in flight leaves every rank's gradients as its
replica's own sums, for recovery to reduce again (``replicas.reduce``).

Used only when the writing-back is sound: the sharded gradients must be fresh views of the
outputs (none existed before this step's reduce-scatter, as after ``optimizer.zero_grad()``),
and every replica must run a backward (as many samples as replicas), so that all issue the
same collectives in the same order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from unicron.train import sharded
from unicron.train.gradsync import wait_or_abandon
from unicron.train.peers import Peers
from unicron.train.replicas import all_or_none


class UnitSums:
    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.units = sharded.fsdp_modules(model)
        self.usable = bool(self.units)
        try:
            for unit in self.units:
                unit.set_all_reduce_hook(self._reduced)
        except ValueError:  # several parameter groups in a unit: the sum after backward serves
            self.usable = False
        self.peers: Peers | None = None
        self.scale = 1.0
        self.before_first: Callable[[], None] | None = None  # before the first launch (faults)
        self._reset()

    def _reset(self) -> None:
        # The peers are dropped too: FSDP's hooks keep this object for the model's life, and a
        # group still referenced when the interpreter exits can abort it (gloo's threads).
        self.peers = None
        self.armed = False
        self.flights: list[tuple[torch.Tensor, torch.Tensor, Any]] = []  # (output, sum, work)
        self.error: Exception | None = None

    def can_arm(self) -> bool:
        """Whether the sharded gradients are empty (to be made fresh by the coming reduce)."""
        return self.usable and all(p.grad is None for p in self.model.parameters() if p.requires_grad)

    def arm(self, peers: Peers, scale: float) -> None:
        self._reset()
        self.armed, self.peers, self.scale = True, peers, scale

    def disarm(self) -> None:
        self._reset()

    def _reduced(self, output: torch.Tensor) -> None:
        if not self.armed or self.error is not None or self.peers is None:
            return
        try:
            if not self.flights and self.before_first is not None:
                self.before_first()
            summed = output.clone()
            if self.scale != 1.0:
                summed.mul_(self.scale)
            self.flights.append((output, summed, self.peers.all_reduce_async(summed)))
        except Exception as exc:  # raised again by finish, where recovery handles it
            self.error = exc

    def finish(self, replica: Peers, abandoned: Callable[[], bool] | None) -> None:
        """Wait for every unit's sum; write them back once the whole replica has its own."""
        assert self.peers is not None
        try:
            failure = self.error
            if failure is None and len(self.flights) != len(self.units):
                failure = RuntimeError(f"{len(self.flights)} of {len(self.units)} units were reduced")
            for _, _, work in self.flights if failure is None else ():
                try:
                    wait_or_abandon(work, self.peers, abandoned)
                except Exception as exc:  # told to the replica first
                    failure = exc
                    break
            all_or_none(replica, failure)
            for output, summed, _ in self.flights:
                output.copy_(summed)
        finally:
            self.disarm()

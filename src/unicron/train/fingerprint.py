"""What tells replicas' states apart, bit for bit, at the cost of one read of the state.

Every replica of a task applies the same gradient sum to the same state, so their parameters and
optimizer state are the same bit for bit (DDP assumes it too). A state's fingerprint is one
64-bit sum per tensor of the tensor's bits, read as integers, taken on its device. Integer
addition wraps exactly and does not depend on the order, so equal tensors give equal sums on any
device, and any one flipped bit changes its tensor's sum (by a power of two, modulo 2**64).
Megatron-LM's ``check_param_hashes_across_dp_replicas`` hashes every parameter on the host
instead, and is meant to run rarely. ``replicacheck.py`` compares fingerprints in each step's
gradient sum and before checkpoints; ``membership.agree`` compares them when a group re-forms;
both name the odd replicas by one rule (``verdict``: a strict majority, or none trusted).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch.distributed.tensor import DTensor

# Same-width integer types, to read a tensor's bits where its bytes are no whole 64-bit words.
_INTEGERS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class ReplicasDiverged(RuntimeError):
    """Replicas hold different states and no live one can be trusted: every rank raises it, and
    the task goes back to its newest checkpoint (``ErrorKind.REPLICAS_DIVERGED``). ``odd``: the
    ranks whose state is not the majority's (every rank where none is)."""

    def __init__(self, why: str, odd: frozenset[int]) -> None:
        super().__init__(why)
        self.odd = odd


def state_tensors(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """What the next step computes from, in an order every replica shares: the parameters, then
    the optimizer's tensors per parameter, by key. (Buffers are left out: a replica's running
    statistics may follow its own samples.)"""
    tensors: list[torch.Tensor] = list(model.parameters())
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state.get(p, {})
            tensors += [state[key] for key in sorted(state) if isinstance(state[key], torch.Tensor)]
    return tensors


def fingerprint(tensors: Iterable[torch.Tensor], host: bool = True) -> torch.Tensor:
    """One 64-bit sum of bits per tensor (of a sharded tensor, of this rank's shard): on the host
    (one copy from the device), or left on the device (``host`` False: nothing waits for it)."""
    sums = [_bit_sum(t.to_local() if isinstance(t, DTensor) else t) for t in tensors]
    if not sums:
        return torch.zeros(0, dtype=torch.int64)
    stacked = torch.stack([s.to(sums[0].device) for s in sums])
    return stacked.cpu() if host else stacked


def _bit_sum(tensor: torch.Tensor) -> torch.Tensor:
    flat = tensor.detach().reshape(-1)
    try:
        return flat.view(torch.int64).sum()  # whole, aligned 64-bit words: the fast path
    except RuntimeError:
        return flat.view(_INTEGERS[flat.element_size()]).sum(dtype=torch.int64)


def as_number(sums: torch.Tensor) -> int:
    """A fingerprint as one number that fits a collective's int64."""
    return int(hashlib.blake2b(sums.cpu().numpy().tobytes(), digest_size=7).hexdigest(), 16)


@dataclass(frozen=True)
class Verdict:
    """What follows a mismatch: ``odd``, the ranks whose state is not the majority's (every rank
    where none is); ``source``, the rank they take state from (None: no live state is trusted,
    the task goes back to its checkpoint); ``why``, in words."""

    odd: frozenset[int]
    source: int | None
    why: str


def verdict(states: Sequence[Sequence[int]], fresh: bool) -> Verdict:
    """From every rank's fingerprint (rank order), ``fresh``: whether the replicas were alike at
    the check before, the step before (nothing computed from an odd state reached a sum since)."""
    holders: dict[tuple[int, ...], list[int]] = {}
    for rank, row in enumerate(states):
        holders.setdefault(tuple(row), []).append(rank)
    majority = max(holders.values(), key=len)  # (the first found among equals: the lowest rank's)
    world = len(states)
    if 2 * len(majority) <= world:
        why = f"{len(holders)} different states among {world} replicas, none a majority's"
        return Verdict(frozenset(range(world)), None, why)
    odd = frozenset(range(world)) - frozenset(majority)
    named = f"rank {', '.join(str(r) for r in sorted(odd))} holds a state unlike the {len(majority)} others'"
    if not fresh:
        return Verdict(odd, None, named + ", found steps after they were last alike")
    return Verdict(odd, min(majority), named)

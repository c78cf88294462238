"""Replicas hold the same state: checked at step boundaries, and mended.

Every replica of a task applies the same gradient sum to the same state, so their parameters and
optimizer state are the same, bit for bit (DDP assumes it too). A bit flipped in one replica's
memory, or an update its device computed wrong, breaks that and fails nothing: the odd replica's
gradients then enter every later sum, and its state every checkpoint it writes. So at the end
of a step (after the optimizer's update, before anything is computed from it or saved), every
``run.digest_every`` steps and before every checkpoint, the replicas compare their state:

- Each rank sums the bits of each of its state's tensors (the parameters and the optimizer's
  tensors), read as 64-bit integers, on its device (``fingerprint``). Integer addition wraps
  exactly and does not depend on the order, so equal tensors give equal sums on any device, and
  one flipped bit changes its tensor's sum (by a power of two, modulo 2**64). It reads the state
  once, as the gradient norm reads the gradients; Megatron-LM's
  ``check_param_hashes_across_dp_replicas`` hashes every parameter on the host instead, and is
  meant to run rarely.
- One all-reduce of the sums and of their complements (the maximum of each) tells every rank
  whether all agree (``agreed``).
- Where they do not, the ranks gather their sums, and ``verdict`` says what follows. Where a
  strict majority holds one state and the replicas agreed at the step before (so nothing
  computed from the odd state can have reached the others), the odd ranks take the majority's
  state in place, through ``membership``'s transfer checked against the sender's digest, and
  training goes on (a ``replica_repaired`` incident). Otherwise no live state can be trusted:
  with two replicas nothing tells which is right, and steps computed since the last agreement
  put the odd replica's gradients into every replica's sum. Every rank then raises
  ``ReplicasDiverged``, and the coordinator relaunches the task from its newest checkpoint, which
  was written only once the replicas agreed.

Why every step by default: a check costs one read of the state and a small all-reduce (measured
beside the gradient test in docs/performance.md), and only a check at every step keeps every
odd replica mendable in place; with checks further apart, a mismatch costs a relaunch and the
steps since the newest checkpoint.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from unicron.train import membership
from unicron.train.peers import Peers
from unicron.train.state import TrainState

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


def fingerprint(tensors: Iterable[torch.Tensor]) -> torch.Tensor:
    """One 64-bit sum of bits per tensor, as a CPU tensor (one copy from the device)."""
    sums = [_bit_sum(t) for t in tensors if t.numel()]
    if not sums:
        return torch.zeros(0, dtype=torch.int64)
    return torch.stack([s.to(sums[0].device) for s in sums]).cpu()


def _bit_sum(tensor: torch.Tensor) -> torch.Tensor:
    flat = tensor.detach().reshape(-1)
    try:
        return flat.view(torch.int64).sum()  # whole, aligned 64-bit words: the fast path
    except RuntimeError:
        return flat.view(_INTEGERS[flat.element_size()]).sum(dtype=torch.int64)


def agreed(peers: Peers, sums: torch.Tensor) -> bool:
    """Whether every peer's ``sums`` equal this one's: one all-reduce of the maxima of the sums
    and of their complements (the complement's maximum is the complement of the minimum)."""
    both = torch.cat([sums, torch.bitwise_not(sums)])
    peers.maximum_of(both)
    n = sums.numel()
    return bool(torch.equal(both[:n], torch.bitwise_not(both[n:])))


@dataclass(frozen=True)
class Verdict:
    """What follows a mismatch: ``odd``, the ranks whose state is not the majority's (every rank
    where none is); ``source``, the rank they take state from (None: no live state is trusted,
    the task goes back to its checkpoint); ``why``, in words."""

    odd: frozenset[int]
    source: int | None
    why: str


def verdict(sums: Sequence[Sequence[int]], fresh: bool) -> Verdict:
    """From every rank's sums (rank order), ``fresh``: whether the replicas agreed at the end of
    the step before (nothing computed from an odd state can have reached the others)."""
    holders: dict[tuple[int, ...], list[int]] = {}
    for rank, row in enumerate(sums):
        holders.setdefault(tuple(row), []).append(rank)
    majority = max(holders.values(), key=len)  # (the first found among equals: the lowest rank's)
    world = len(sums)
    if 2 * len(majority) <= world:
        why = f"{len(holders)} different states among {world} replicas, none a majority's"
        return Verdict(frozenset(range(world)), None, why)
    odd = frozenset(range(world)) - frozenset(majority)
    named = ", ".join(str(r) for r in sorted(odd))
    if not fresh:
        why = f"rank {named} holds a state unlike the others', found steps after they last agreed"
        return Verdict(odd, None, why)
    return Verdict(odd, min(majority), f"rank {named} holds a state unlike the {len(majority)} others'")


def mend(peers: Peers, train: TrainState, found: Verdict) -> None:
    """The odd ranks take ``found.source``'s state (checked against its digest on arrival)."""
    source = found.source
    assert source is not None
    digest = torch.zeros(1, dtype=torch.int64)
    if peers.rank == source:
        digest[0] = membership.digest_number(train.digest())
    peers.broadcast(digest, source)
    if not membership.send_state(peers, train, source, int(digest[0]), peers.rank in found.odd):
        why = f"rank {source}'s state failed its digest check on the way: {found.why}"
        raise ReplicasDiverged(why, found.odd)


def check(peers: Peers, train: TrainState, fresh: bool) -> Verdict | None:
    """Compare the replicas' states; None where they agree, else the verdict, carried out:
    mended in place, or ``ReplicasDiverged`` raised on every rank."""
    sums = fingerprint(state_tensors(train.model, train.optimizer))
    if agreed(peers, sums):
        return None
    found = verdict([row.tolist() for row in peers.all_gather(sums)], fresh)
    if found.source is None:
        raise ReplicasDiverged(found.why, found.odd)
    mend(peers, train, found)
    return found

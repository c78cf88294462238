"""Replicas hold the same state: checked as they enter each step's gradient sum, and mended.

A bit flipped in one replica's memory, or an update its device computed wrong, changes no norm
that need stand out and fails nothing; the odd replica's gradients then enter every later sum,
and its state every checkpoint it writes. So every ``run.digest_every`` steps (1 by default),
each rank takes the fingerprint of its parameters (``fingerprint.py``) as the step's gradient
sum is taken, once the backward pass has read them all, and the ranks compare them in the sum
itself: ``offer`` appends to the small buffer summed beside the gradients (the step's metrics)
four 16-bit pieces of the fingerprint and their squares, and once summed, ``alike`` says whether
every rank offered the same (by Cauchy-Schwarz: the sum of n equal values squared is n times the
sum of their squares, and only then). No collective is added, and the sum is tested before
anything of it is written back, as the gradient test does (``numerics.py``).

Where the parameters differ, nothing of the sum is applied (``StateUnlike``), and the ranks
gather their fingerprints; ``fingerprint.verdict`` says what follows:

- One set of parameters held by a strict majority, and the replicas alike in the sum before
  (the odd state came about since: in that step's update, or in memory after): the odd ranks
  take the majority's state in place (parameters, optimizer and registered objects, through
  ``membership``'s transfer checked against the sender's digest), compute their micro-batches
  again, and the sum is taken again: nothing computed from the odd state is applied. A
  ``replica_repaired`` incident.
- Otherwise no live state can be trusted: with two replicas nothing tells which is right; with
  checks ``run.digest_every`` steps apart, the odd replica's gradients may be in the sums since
  the last. Every rank raises ``ReplicasDiverged``, and the coordinator relaunches the task from
  its newest checkpoint.

Before every checkpoint, and at the last step, the whole state (the optimizer's tensors too) is
compared at the step's end (``check``: one all-reduce of the fingerprints and of their
complements, the maximum of each), so that a checkpoint is written only once the replicas
agree; a mismatch there is judged likewise.

Why every step by default: the check costs one read of the parameters per step and no
collective (measured beside the gradient test in docs/performance.md), and only a check at every
step keeps every odd replica mendable in place.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from unicron.train import gradsync, membership
from unicron.train.fingerprint import ReplicasDiverged, Verdict, fingerprint, state_tensors, verdict
from unicron.train.peers import Peers
from unicron.train.state import TrainState

PIECES = 4  # 16-bit pieces of a 64-bit fingerprint: sums of their squares stay exact in float64
OFFERED = 2 * PIECES + 1  # each piece and its square, and a count


class StateUnlike(RuntimeError):
    """The ranks' parameters differed as they entered the step's sum: nothing of it applied."""


def offer(summed: torch.Tensor) -> torch.Tensor:
    """What this rank adds to the step's summed buffer (float64, on ``summed``'s device): each
    16-bit piece of its parameters' fingerprint (``summed``: a sum per tensor, each weighed by an
    odd number, so a change to one tensor's always shows), its square, and 1."""
    weights = torch.arange(1, 2 * summed.numel() + 1, 2, dtype=torch.int64, device=summed.device)
    whole = (summed * weights).sum()  # (wraps modulo 2**64: still a change where one sum changed)
    pieces = torch.stack([(whole >> (16 * i)) & 0xFFFF for i in range(PIECES)]).to(torch.float64)
    one = torch.ones(1, dtype=torch.float64, device=summed.device)
    return torch.cat([torch.stack([pieces, pieces * pieces], dim=1).reshape(-1), one])


def alike(offered: Sequence[float]) -> bool:
    """Whether every rank offered the same (``offered``: the sums of ``offer``'s values over the
    ranks; exact integers in float64, below 2**53 for fewer than 2**21 ranks)."""
    count = int(offered[-1])
    pairs = [(int(offered[2 * i]), int(offered[2 * i + 1])) for i in range(PIECES)]
    return all(total * total == count * squares for total, squares in pairs)


def settle(peers: Peers, train: TrainState, mine: torch.Tensor, fresh: bool) -> Verdict:
    """After a mismatch: gather every rank's fingerprint ``mine``, judge, and carry it out: the
    odd ranks take the majority's state (checked against its digest on arrival), or
    ``ReplicasDiverged`` is raised on every rank."""
    found = verdict([row.tolist() for row in peers.all_gather(mine.cpu())], fresh)
    source = found.source
    if source is None:
        raise ReplicasDiverged(found.why, found.odd)
    digest = torch.zeros(1, dtype=torch.int64)
    if peers.rank == source:
        digest[0] = membership.digest_number(train.digest())
    peers.broadcast(digest, source)
    if not membership.send_state(peers, train, source, int(digest[0]), peers.rank in found.odd):
        why = f"rank {source}'s state failed its digest check on the way: {found.why}"
        raise ReplicasDiverged(why, found.odd)
    return found


def check(
    peers: Peers, train: TrainState, fresh: bool, abandoned: Callable[[], bool] | None = None
) -> Verdict | None:
    """At a step's end, before a checkpoint: compare the whole states (the parameters and the
    optimizer's tensors). None where all agree, else the verdict, carried out (``settle``). The
    all-reduce is abandoned as the step's sum is (``gradsync.wait_or_abandon``: a peer gone
    silent)."""
    state = fingerprint(state_tensors(train.model, train.optimizer))
    both = torch.cat([state, torch.bitwise_not(state)])
    gradsync.wait_or_abandon(peers.maximum_of_async(both), peers, abandoned)
    n = state.numel()
    if torch.equal(both[:n], torch.bitwise_not(both[n:])):
        return None
    return settle(peers, train, state, fresh)

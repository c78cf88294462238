"""Numerical faults in the step (issue 55): a gradient sum that is wrong (not finite, or a
spike in its norm: ``spikes.py``), the ranks whose own gradients made it so, and whose fault it
is (the device's, the data's, or a passing one).

The sum is looked at before it is written back into the gradients, so every rank still holds
its own (``gradsync``): a NaN or an Inf in any rank's gradients makes the sum non-finite on
every rank alike (NaN + x is NaN; Inf - Inf is NaN), and every rank reduces the same sum, so all
ranks take the same branch and their collectives keep matching. The norm of the reduced buffers
is the cheap test (one pass, no tensor of flags); only then does each rank test its own
gradients (their norm, as its share of the sum: not finite, or over the spike's limit alone)
and the ranks tell each other whose were wrong (one small collective, on the fault's path only).

What follows is decided by :func:`judge` from the computations' outcomes:

1. the step's micro-batches are computed again by the same ranks: a sum now right was a
   passing fault (``TRANSIENT``: the step goes on with the new sum, nothing of the bad one
   applied);
2. wrong again: every rank computes the micro-batches of the rank before it (rank r those
   of rank r - 1, cyclically), and the ranks tell each other whose gradients are wrong
   (nothing is summed: the suspects' results are not to be trusted). A suspect's samples that
   are wrong on another rank too are the data's fault (``DATA``); else the suspect's device
   computed wrong twice for samples another device computes right (``DEVICE``: its node is
   taken out, the others go on in place, without its results). With one rank there is no other
   device to ask, nor where every rank, or two neighbours, are suspects: ``UNRESOLVED``.

Nothing is retried past these three computations: a fault that persists has a verdict. Nor
does a rank get a second chance soon: one named in a passing fault within ``REPEAT_STEPS``
steps of the same generation is cross-checked at once (:func:`repeated`), so a device that
fails now and then is taken out rather than forgiven each time.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from unicron.train.peers import Peers


class WrongSum(Exception):
    """The step's gradient sum is wrong (not finite, or a ``spike``): nothing was written back
    (internal to the step; the message says how it is wrong)."""

    def __init__(self, why: str, spike: bool = False) -> None:
        super().__init__(why)
        self.spike = spike


class SilentDataCorruption(RuntimeError):
    """This rank's device computed wrong gradients for samples another device computes right:
    its node must leave (``ErrorKind.SILENT_DATA_CORRUPTION``)."""


class NumericalDataFault(RuntimeError):
    """The step's samples give wrong gradients wherever they are computed, or it could not be
    told whose fault it is: the task stops with the verdict (``ErrorKind.NUMERICAL_DATA``)."""


class Verdict(enum.StrEnum):
    TRANSIENT = "transient"  # computed again, right: the step goes on
    DEVICE = "device"  # the suspects' devices: they leave, the others go on in place
    DATA = "data"  # the suspects' samples are wrong on another rank too
    UNRESOLVED = "unresolved"  # one rank, every rank, or neighbours: cannot be told


class Outcome(enum.StrEnum):
    """What was done about a verdict (``numericstep.py``)."""

    RECOMPUTED = "recomputed"  # transient: the step goes on with the sum computed again
    LEFT = "left"  # device: the suspects leave, the others go on in place
    SKIPPED = "skipped"  # the data's: the step's update skipped (run.on_bad_data: skip)
    # A spike the data gives wherever computed: applied, as training without the test would (it
    # is the data's gradient; clipping, if the loop clips, bounds it). A NaN never is.
    APPLIED = "applied"
    FAILED = "failed"  # the data's: the task ends with the verdict
    REPAIRED = "repaired"  # a replica's state unlike the others': it took theirs (``replicacheck.py``)


@dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    ranks: frozenset[int]  # the ranks at fault (DEVICE), or whose samples are (DATA)
    why: str


# A rank named again this soon after a passing fault is cross-checked at once: silent corruption
# is rare enough (Llama 3: 6 interruptions in 54 days on 16,384 GPUs) that two strikes on one
# device within a hundred steps say more of the device than of chance.
REPEAT_STEPS = 100


def repeated(
    suspects: frozenset[int], passing: dict[int, tuple[int, int]], generation: int, step: int
) -> frozenset[int]:
    """The ``suspects`` named in a passing fault within ``REPEAT_STEPS`` steps before ``step`` in
    this ``generation`` (``passing``: rank -> (generation, step) of its last one; a rank number
    of another generation may be another process)."""
    return frozenset(
        r
        for r in suspects
        if r in passing and passing[r][0] == generation and step - passing[r][1] <= REPEAT_STEPS
    )


def rotated(rank: int, world: int) -> int:
    """The rank whose micro-batches ``rank`` computes in the cross-check (the one before it)."""
    return (rank - 1) % world


def judge(
    first: frozenset[int], again: frozenset[int] | None, cross: frozenset[int] | None, world: int
) -> Judgement | None:
    """The verdict on a step whose sum was wrong (``first``: the ranks whose own gradients
    were), given the ranks wrong when the same ranks computed again (``again``; None: not yet)
    and when each computed the micro-batches of the rank before it (``cross``; None: not yet).
    None: compute again (the next computation is the one this needs)."""
    if again is None:
        return None
    if not again:
        return Judgement(Verdict.TRANSIENT, first, f"computed again, right (first wrong: {_ranks(first)})")
    if world == 1 or not again < frozenset(range(world)):
        why = "one rank: no other device to compare with" if world == 1 else "every rank"
        return Judgement(Verdict.UNRESOLVED, again, f"wrong twice on {_ranks(again)} ({why})")
    if cross is None:
        return None
    # A suspect's samples were checked by the rank after it: no check at all if that one is a
    # suspect too (its result says nothing of the samples).
    unchecked = frozenset(s for s in again if (s + 1) % world in again)
    if unchecked:
        return Judgement(
            Verdict.UNRESOLVED,
            again,
            f"wrong twice on {_ranks(again)}, neighbours: no healthy rank to check",
        )
    data = frozenset(s for s in again if (s + 1) % world in cross)  # its samples, wrong elsewhere
    if data:
        return Judgement(Verdict.DATA, data, f"the samples of {_ranks(data)} are wrong on other ranks too")
    return Judgement(
        Verdict.DEVICE,
        again,
        f"{_ranks(again)} wrong twice on their samples, which other ranks compute right",
    )


def _ranks(ranks: frozenset[int]) -> str:
    return "rank " + ", ".join(map(str, sorted(ranks))) if ranks else "no rank"


HALF = (torch.float16, torch.bfloat16)


def norm(buffers: Sequence[torch.Tensor]) -> float:
    """The L2 norm of ``buffers`` together (one pass each and one read back to the host for all):
    not finite where any element is not, or where one is too large for its square to be held
    (over about 1.8e19 in float32: no gradient that large is right either). Half precision is
    taken in float32."""
    if not buffers:
        return 0.0
    norms = [torch.linalg.vector_norm(b, dtype=torch.float32 if b.dtype in HALF else None) for b in buffers]
    return float(torch.linalg.vector_norm(torch.stack(norms)))


def gradients_norm(params: Sequence[torch.Tensor]) -> float:
    """The norm of this rank's own gradients (its local sums, not yet written over)."""
    grads = [p.grad for p in params if p.grad is not None]
    return norm([g.detach().reshape(-1) for g in grads])


def named(peers: Peers | None, rank: int, world: int, wrong_here: bool) -> frozenset[int]:
    """The ranks whose own gradients are wrong, every rank told (one collective)."""
    if peers is None or world == 1:
        return frozenset({0}) if wrong_here else frozenset()
    flags = [0] * world
    flags[rank] = 1 if wrong_here else 0
    return frozenset(r for r, bad in enumerate(peers.maxima(flags)) if bad)

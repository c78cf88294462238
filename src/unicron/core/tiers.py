"""The recovery tiers: what handling a failure does, cheapest first, and when a tier cannot apply.

One enum for the ladder (which tier a failure asks for), the coordinator (which it carries out),
the events and metrics (which was carried out) and the simulator (which it models). Each tier
has exactly one meaning, told by the processes, not by a label:

- ``REATTEMPT``: no process ends or starts; every rank re-forms its process group and retries
  the interrupted step (the same members, the next generation).
- ``RESTART_FAILED``: the failed processes end; the others go on in place without them (the
  next generation), and new processes take their state from a live peer when the plan grows the
  task back onto the freed slots.
- ``RECONFIGURE``: as ``RESTART_FAILED``, and the failed node leaves the cluster (isolated); the
  cluster is re-planned without it.
- ``FROM_CHECKPOINT``: every process of the task ends; it is relaunched from its newest durable
  checkpoint.
- ``FAIL_TASK``: the task ends as failed; restarting it again is futile.

A tier that cannot apply (``precondition``) gives way to the next, and the reason is recorded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum


class Tier(IntEnum):
    """Recovery tiers, cheapest first (compare with < to escalate)."""

    REATTEMPT = 1
    RESTART_FAILED = 2
    RECONFIGURE = 3
    FROM_CHECKPOINT = 4
    FAIL_TASK = 5

    @property
    def label(self) -> str:
        return _LABELS[self]

    @property
    def in_place(self) -> bool:
        """Whether the tier keeps the surviving processes running (a generation re-formed)."""
        return self <= Tier.RECONFIGURE

    def next(self) -> Tier:
        return Tier(min(self + 1, Tier.FAIL_TASK))


_LABELS = {
    Tier.REATTEMPT: "reattempt in place",
    Tier.RESTART_FAILED: "restart failed processes",
    Tier.RECONFIGURE: "reconfigure",
    Tier.FROM_CHECKPOINT: "restart from checkpoint",
    Tier.FAIL_TASK: "fail task",
}


def tier_named(label: str) -> Tier:
    """The tier an event recorded by its label."""
    for tier, name in _LABELS.items():
        if name == label:
            return tier
    raise ValueError(f"no recovery tier is labelled {label!r}")


def precondition(tier: Tier, in_place: bool, failed: frozenset[int] | None, node: str | None) -> str | None:
    """Why ``tier`` cannot apply to a failure, from what is known of it (None: it may).

    ``in_place``: the task recovers with its processes running (``run.recovery: in_process``
    and no grow under way); ``failed``: the ranks known to be gone (None: they cannot be told
    apart); ``node``: the node blamed (None: the fault is the task's or its storage's, or its
    place is not known). Whether enough survivors remain is the caller's to check (it needs the
    cluster)."""
    if not tier.in_place:
        return None
    if tier is Tier.RECONFIGURE and node is None:
        return "no node is to blame, so none can leave the cluster"
    if not in_place:
        return "the task recovers by relaunching (run.recovery: restart, or a grow under way)"
    if failed is None:
        return "which ranks failed is not known, so the survivors cannot be told apart"
    if tier is Tier.REATTEMPT and failed:
        return f"rank(s) {sorted(failed)} are gone: a reattempt needs every rank alive"
    if tier is Tier.RESTART_FAILED and not failed:
        return "no rank failed: every process is alive, none to restart"
    return None


def isolation_spent(isolated: int, nodes: int, fraction: float) -> str | None:
    """Why no more node may be isolated (None: one may): at most ``fraction`` of the ``nodes``
    registered, at least one, are isolated at once (``max_isolated_fraction``). Past it, errors
    on node after node say more of the program or the network than of the machines."""
    if isolated < max(1, int(fraction * nodes)):
        return None
    return f"{isolated} of {nodes} nodes are isolated already (max_isolated_fraction {fraction:g})"


@dataclass(frozen=True)
class Escalation:
    """A tier that could not apply, or failed, and the one taken instead."""

    from_tier: Tier
    to_tier: Tier
    why: str


def first_applicable(
    wanted: Tier, why_not: Callable[[Tier], str | None]
) -> tuple[Tier, tuple[Escalation, ...]]:
    """The cheapest tier at or above ``wanted`` that applies (``why_not`` is None for it), and
    the escalations on the way, each with its reason. ``FAIL_TASK`` always applies."""
    tier, passed = wanted, []
    while tier is not Tier.FAIL_TASK and (why := why_not(tier)) is not None:
        passed.append(Escalation(tier, tier.next(), why))
        tier = tier.next()
    return tier, tuple(passed)

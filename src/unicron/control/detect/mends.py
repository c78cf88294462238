"""Wrong numbers undone in the step, counted against the node of the rank each named.

A rank whose gradients were wrong once and right computed again (a transient) or whose replica
alone differed from its peers (mended in place from theirs) stops nothing: each is undone inside
the step (``detect/reported.py:passing_fault``). A node whose ranks keep needing it is another
matter: a device that computes a wrong value now and then passes every single check, and would
be mended for ever (the endless loop users of Megatron-LM's rerun machine report when a job gets
the same GPU back). So, as the ladder counts a node's errors (``core/ladder.py``), ``limit`` of
them within ``window_s``, each naming one rank on the node, are a device fault: the node is taken
out as the cross-check takes out a device it finds wrong (``silent_data_corruption``, its ranks
failed, the others going on in place). Faults the data gives (a step skipped, a spike applied) or
that name no one rank are not counted.

The counts are kept in the store (``core/kept.py:DeviceMends``): a coordinator that takes over
or restarts goes on counting from its predecessor's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from unicron.core.kept import DeviceMends
from unicron.core.protocol import NumericalReport

# What was done about wrong numbers that a device (the rank named) may have computed: computed
# again right ("recomputed"), or the rank's replica mended from its peers' ("repaired").
DEVICE_OUTCOMES = frozenset({"recomputed", "repaired"})


def names_a_device(report: NumericalReport) -> bool:
    """Whether the report blames one rank's device: a fault undone in the step that named it alone."""
    return report.outcome in DEVICE_OUTCOMES and report.ranks == [report.rank]


@dataclass
class Mends:
    """Per node, when wrong numbers of one of its ranks were undone in the step (within the
    window)."""

    limit: int
    window_s: float
    seen: dict[str, list[float]] = field(default_factory=dict)

    def note(self, node: str, at: float) -> int | None:
        """One more on ``node`` at ``at``: how many within the window once they reach the limit
        (the node is then taken out, and its count starts again), else None."""
        recent = [t for t in self.seen.get(node, []) if at - t <= self.window_s] + [at]
        if len(recent) >= self.limit:
            self.seen.pop(node, None)
            return len(recent)
        self.seen[node] = recent
        return None

    def kept(self) -> DeviceMends:
        return DeviceMends(seen={node: list(times) for node, times in self.seen.items()})

    def restore(self, kept: DeviceMends) -> None:
        self.seen = {node: list(times) for node, times in kept.seen.items()}

"""A hang that no rank can be blamed for, held open while the agents probe each other.

The detector opens a ``PeerCheck`` instead of an incident when every rank of a generation that
spans several nodes waits in a collective; the order to dump stacks carries every node's probe
endpoint. Each agent's stacks report says which peers it could not reach. Once every node has
answered (or ``PEER_CHECK_S`` has passed) the check is judged (``partition_verdict``):
a node its peers cannot reach becomes a ``node_partitioned`` incident for that node, whose ranks
are the failed ones, so the others recover in place and the node is isolated; otherwise the hang
is opened as before. The check adds the probe's time (at most ``PROBE_TIMEOUT_S``) to the hang's
detection, and nothing when the network is whole but the probe's connects (milliseconds).

When every node reaches every other the network is slow rather than broken, and the step gets a
grace. If some worker connection was then waiting on a TCP retransmission (``tcpretrans``), the
stall is a lossy link's backoff, which ends by itself: the grace is renewable, and the detector
checks again when it runs out (``network_grace_renewals`` times at most). Without that evidence
the grace is given once per step. A step still late after its graces is stuck, not slow
(``STUCK``): every rank is alive and none to blame, so it is reattempted in place, every rank
leaving the collective and re-forming; a reattempt that does not mend it escalates.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from unicron.brain.records import NodeRecord, WorkerRecord
from unicron.core.protocol import PROBE_TIMEOUT_S, StacksReport
from unicron.core.taxonomy import ErrorKind

# What a collective that no rank can be blamed for is, once it outlasts its graces while every
# node reaches every other: a network fault (SEV3), so the cheapest tier, a reattempt in place.
STUCK = ErrorKind.OTHER_NETWORK_ERROR

# Dump (0.5 s) and probe in parallel, then one heartbeat or two for the report to arrive.
PEER_CHECK_S = PROBE_TIMEOUT_S + 3.0


@dataclass(frozen=True)
class PartitionVerdict:
    culprits: tuple[str, ...]  # nodes to take out, most cut-off first; empty: no one to blame
    why: str


def partition_verdict(reports: Mapping[str, Collection[str]], nodes: Collection[str]) -> PartitionVerdict:
    """``reports``: node -> the peers it could not reach (a node that did not report reached no
    verdict of its own). Greedily take the nodes in the most failed pairs, stopping when every
    failed pair is accounted for, or when those nodes cannot reach each other either: two
    halves, or two nodes, that cannot reach each other (either could be the one cut off).
    Nodes taken together reach each other: a group cut off from a larger one."""
    pairs = {frozenset((a, b)) for a, lost in reports.items() for b in lost if a != b and b in nodes}
    culprits: list[str] = []
    while pairs:
        degree = Counter(node for pair in pairs for node in pair)
        most = max(degree.values())
        tied = sorted(node for node, count in degree.items() if count == most)
        if any(frozenset(two) in pairs for two in itertools.combinations(tied, 2)):
            break
        culprits += tied
        pairs = {pair for pair in pairs if not pair & set(tied)}
    if not culprits:
        if not any(reports.values()):
            return PartitionVerdict((), "every node reaches every other: not the network between them")
        return PartitionVerdict((), f"nodes cannot reach each other but none stands out: {_said(reports)}")
    return PartitionVerdict(tuple(culprits), f"{', '.join(culprits)} cut off from peers: {_said(reports)}")


def _said(reports: Mapping[str, Collection[str]]) -> str:
    return "; ".join(f"{a} cannot reach {', '.join(sorted(b))}" for a, b in sorted(reports.items()) if b)


def probe_endpoints(nodes: Sequence[NodeRecord], names: set[str]) -> dict[str, str] | None:
    """``host:port`` of each named node's probe listener; None unless every one has a listener
    (an agent from before probes, or a single node: nothing to check)."""
    found = {n.name: f"{n.host}:{n.probe_port}" for n in nodes if n.name in names and n.probe_port}
    return found if len(names) > 1 and len(found) == len(names) else None


@dataclass
class PeerCheck:
    task: str
    generation: int
    step: int  # the late step
    since: float  # when the late step began
    why: str  # the hang verdict's
    deadline: float
    ranks: dict[str, set[int]]  # node -> the ranks of the generation that run there
    unreachable: dict[str, list[str]] = field(default_factory=dict)  # node -> peers it cannot reach
    retransmitting: dict[str, int] = field(default_factory=dict)  # node -> worker connections retransmitting
    stacks: list[StacksReport] = field(default_factory=list)

    @classmethod
    def of(cls, workers: Sequence[WorkerRecord], step: int, since: float, why: str, now: float) -> PeerCheck:
        ranks: dict[str, set[int]] = {}
        for w in workers:
            ranks.setdefault(w.node, set()).add(w.rank)
        first = workers[0]
        return cls(first.task, first.generation, step, since, why, now + PEER_CHECK_S, ranks)

    def add(self, report: StacksReport) -> None:
        self.stacks.append(report)
        if report.unreachable is not None:
            self.unreachable[report.node] = list(report.unreachable)
        if report.retransmitting is not None:
            self.retransmitting[report.node] = report.retransmitting

    def complete(self, now: float) -> bool:
        return now >= self.deadline or set(self.unreachable) >= set(self.ranks)

    def verdict(self) -> PartitionVerdict:
        return partition_verdict(self.unreachable, set(self.ranks))

    def failed(self, culprits: Sequence[str]) -> set[int]:
        return {rank for node in culprits for rank in self.ranks.get(node, ())}


@dataclass(frozen=True)
class CheckOutcome:
    """What a complete peer check decides: more time (``grace_s`` > 0, no incident; ``renewable``
    when TCP was seen retransmitting), or the incident to open: its kind, node, failed ranks
    (None: which ones is not known; empty: every rank is alive, none to blame) and why."""

    verdict: PartitionVerdict
    grace_s: float = 0.0
    kind: ErrorKind = ErrorKind.TASK_HANG
    node: str | None = None
    failed: frozenset[int] | None = None
    why: str = ""
    renewable: bool = False


def outcome(check: PeerCheck, grace_s: float) -> CheckOutcome:
    """A node its peers cannot reach fails (its ranks) and is taken out. If every node answered
    and reaches every other, the network is slow rather than broken (a lossy link's
    retransmissions): the step gets ``grace_s`` more, renewable when a worker connection was
    seen retransmitting (with no grace to give, it is ``STUCK``). Otherwise the hang is what it
    was."""
    verdict = check.verdict()
    late = f"step {check.step} late"
    if verdict.culprits:
        failed = frozenset(check.failed(verdict.culprits))
        return CheckOutcome(
            verdict, 0.0, ErrorKind.NODE_PARTITIONED, verdict.culprits[0], failed, f"{late}; {verdict.why}"
        )
    whole = set(check.unreachable) >= set(check.ranks) and not any(check.unreachable.values())
    why = f"{late}; hung rank(s) unknown: {check.why}; {verdict.why}"
    if not whole:
        return CheckOutcome(verdict, why=why)
    if grace_s <= 0:  # no grace for a slow network: stuck
        return CheckOutcome(
            verdict,
            kind=STUCK,
            failed=frozenset(),
            why=f"{late}; every node reaches every other: {check.why}",
        )
    return CheckOutcome(verdict, grace_s, renewable=sum(check.retransmitting.values()) > 0, why=why)

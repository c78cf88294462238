"""Which node its peers cannot reach: the check behind a hang that no rank can be blamed for.

When every rank of a generation waits in a collective, no worker is to blame; on a cluster the
usual cause is the network between nodes, e.g. a host that still reaches the coordinator (so its
heartbeats arrive and it is never declared lost) but no longer its peers. Gloo then waits in
silence until the process-group timeout, and restarting the same placement only forms a group
that cannot connect. So, before a no-culprit hang is answered, each agent of the generation is
asked to connect to every other's probe listener (a TCP port on its node's address that accepts
and closes), and reports the peers it could not reach. ``partition_verdict`` turns those reports
into the nodes to take out: those in the most failed pairs, taken while they still reach each
other, until every failed pair is accounted for. A split into equal halves blames no one.

The listener and the probe run in the agent; the verdict is pure (tested with hand-built reports).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass

PROBE_TIMEOUT_S = 3.0  # a connect within a cluster takes milliseconds; a lost SYN is retried at 1 s
ATTEMPTS = 2  # a lossy link may lose a probe's SYN twice: a node is unreachable when both attempts fail


async def listen(address: str) -> asyncio.Server:
    """A listener on ``address`` (an ephemeral port) that accepts each connection and closes it."""

    async def close(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    return await asyncio.start_server(close, address, 0)


async def reachable(endpoint: str, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether a connection to ``endpoint`` succeeds in one of ``ATTEMPTS`` tries within ``timeout_s``."""
    host, _, port = endpoint.rpartition(":")
    for _ in range(ATTEMPTS):
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), timeout_s / ATTEMPTS)
        except (OSError, TimeoutError, ValueError):
            continue
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True
    return False


async def unreachable(peers: Mapping[str, str], timeout_s: float = PROBE_TIMEOUT_S) -> list[str]:
    """The peers (node -> ``host:port``) that cannot be connected to within ``timeout_s``, all
    tried at once."""
    names = sorted(peers)
    results = await asyncio.gather(*(reachable(peers[n], timeout_s) for n in names))
    return [n for n, ok in zip(names, results, strict=True) if not ok]


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

"""Which node its peers cannot reach: the check behind a hang that no rank can be blamed for.

When every rank of a generation waits in a collective, no worker is to blame; on a cluster the
usual cause is the network between nodes, e.g. a host that still reaches the coordinator (so its
heartbeats arrive and it is never declared lost) but no longer its peers. Gloo then waits in
silence until the process-group timeout, and restarting the same placement only forms a group
that cannot connect. So, before a no-culprit hang is answered, each agent of the generation is
asked to connect to every other's probe listener (a TCP port on its node's address that accepts
and closes), and reports the peers it could not reach; the coordinator turns the reports into
a verdict (``control/detect/peercheck.py:partition_verdict``).

The listener and the probe run in the agent.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping

from unicron.core.protocol import PROBE_TIMEOUT_S

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

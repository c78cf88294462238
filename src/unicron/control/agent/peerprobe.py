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
from asyncio import FIRST_COMPLETED
from collections.abc import Mapping

from unicron.core.protocol import PROBE_TIMEOUT_S

# A lossy link loses a probe's handshake now and then (at a tenth lost each way, about one
# connection in five loses its SYN or SYN-ACK, and the kernel sends the SYN again only after
# 1 s, then 3 s). So a new attempt starts every STAGGER_S beside those still waiting, until one
# succeeds or the time is up: six within 3 s, the earlier ones with a SYN retry of their own
# (two attempts in a row, as before, failed about once in 25 at a tenth lost, and a `make test`
# run once took such a lost probe for a cut link and restarted the task). A refused connection
# (nothing listens) is tried again too, until the time is up: it may be a listener restarting.
STAGGER_S = 0.5


async def listen(address: str) -> asyncio.Server:
    """A listener on ``address`` (an ephemeral port) that accepts each connection and closes it."""

    async def close(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    return await asyncio.start_server(close, address, 0)


async def reachable(endpoint: str, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """Whether a connection to ``endpoint`` succeeds within ``timeout_s``: attempts start every
    ``STAGGER_S`` beside those still waiting (any one succeeding will do)."""
    host, _, port = endpoint.rpartition(":")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    next_start, waiting = loop.time(), set[asyncio.Task[bool]]()
    try:
        while (now := loop.time()) < deadline:
            if now >= next_start:
                waiting.add(asyncio.create_task(_connects(host, port, deadline - now)))
                next_start = now + STAGGER_S
            if not waiting:
                await asyncio.sleep(min(next_start, deadline) - now)
                continue
            pause = min(next_start, deadline) - now
            done, waiting = await asyncio.wait(waiting, timeout=pause, return_when=FIRST_COMPLETED)
            if any(task.result() for task in done):
                return True
        return False
    finally:
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)


async def _connects(host: str, port: str, timeout_s: float) -> bool:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), timeout_s)
    except (OSError, TimeoutError, ValueError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


async def unreachable(peers: Mapping[str, str], timeout_s: float = PROBE_TIMEOUT_S) -> list[str]:
    """The peers (node -> ``host:port``) that cannot be connected to within ``timeout_s``, all
    tried at once."""
    names = sorted(peers)
    results = await asyncio.gather(*(reachable(peers[n], timeout_s) for n in names))
    return [n for n, ok in zip(names, results, strict=True) if not ok]

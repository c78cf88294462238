"""A node's dump of a task's Python stacks at a hang, in two halves.

``begin`` runs at once, in turn with the orders around it: it takes the workers and the ranks they
have now (an in-place recovery's rename may follow in the same batch of orders) and signals them
(faulthandler on SIGUSR1). ``finish`` runs beside the orders that follow: it reads the stacks
after ``order.wait_s``, and the peer probe's answer, which can take seconds on a cut-off host (the
agent's heartbeat must not wait for it, or the node would be declared lost instead of isolated).
A stop ordered after the dump waits for its ``finish``: the hung worker's stack is the one that
matters.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass

from unicron.control.agent import peerprobe, tcpretrans
from unicron.control.agent.processes import Worker, is_stopped, read_stack
from unicron.core.limits import MAX_STACK_CHARS, MAX_STACKS_CHARS
from unicron.core.protocol import DumpStacks, StacksReport


@dataclass(frozen=True)
class StackDump:
    """A dump under way: the workers it covers, by the rank each had when it began."""

    order: DumpStacks
    node: str
    halted: tuple[tuple[int, Worker], ...]  # stopped processes: py-spy reads them from outside
    signalled: tuple[tuple[int, Worker], ...]  # they write their own stack when signalled
    offsets: dict[int, int]  # pid -> the size of its stack file before the signal
    pids: tuple[int, ...]
    probing: asyncio.Future[list[str]] | None  # the peers found unreachable
    sockets: tcpretrans.Waiting | None  # what waited on TCP when the dump began


def begin(order: DumpStacks, node: str, workers: Iterable[Worker]) -> StackDump:
    """Signal the task's live workers here and start probing the peers (needs a running loop)."""
    live = [(w.order.rank, w) for w in workers if w.order.task == order.task and not w.exited]
    halted = tuple((rank, w) for rank, w in live if is_stopped(w.process.pid))
    stopped = {w.process.pid for _, w in halted}
    # Only workers that wrote a position run the library, which handles the signal (SIGUSR1's
    # default action would end any other program).
    signalled = tuple(
        (rank, w) for rank, w in live if w.progress is not None and w.process.pid not in stopped
    )
    offsets = {}
    for _, w in signalled:
        offsets[w.process.pid] = w.stack_file.stat().st_size if w.stack_file.exists() else 0
        with contextlib.suppress(ProcessLookupError):
            os.kill(w.process.pid, signal.SIGUSR1)
    pids = tuple(w.process.pid for _, w in live)
    # The peers are probed meanwhile: a hang no rank is to blame for may be the network.
    probing = asyncio.ensure_future(peerprobe.unreachable(order.peers)) if order.peers else None
    # Read before and after the wait: data still unacknowledged after it waits on TCP.
    sockets = None if probing is None else tcpretrans.read(pids)
    return StackDump(order, node, halted, signalled, offsets, pids, probing, sockets)


async def finish(dump: StackDump) -> StacksReport:
    """Every covered worker's stack, and what the peer probe and the sockets say."""
    stacks = {rank: await read_stack(w.process.pid) for rank, w in dump.halted}
    await asyncio.sleep(dump.order.wait_s)
    for rank, w in dump.signalled:
        with contextlib.suppress(OSError), w.stack_file.open("rb") as f:
            f.seek(dump.offsets[w.process.pid])
            stacks[rank] = f.read(MAX_STACK_CHARS).decode(errors="replace")
    unreachable = None if dump.probing is None else await dump.probing
    retransmitting = None
    if dump.sockets is not None:
        retransmitting = tcpretrans.stalled(dump.sockets, tcpretrans.read(dump.pids))
    return StacksReport(
        task=dump.order.task,
        generation=dump.order.generation,
        node=dump.node,
        stacks=shared(stacks),
        time=time.time(),
        unreachable=unreachable,
        retransmitting=retransmitting,
    )


def shared(stacks: dict[int, str]) -> dict[int, str]:
    """Each stack within its share of MAX_STACKS_CHARS, so that the report fits in a heartbeat
    whatever the node's count of workers (8 get 32,000 characters each; a dump is a few
    thousand). Its start is kept: faulthandler writes the signalled thread first, innermost
    call first."""
    share = min(MAX_STACK_CHARS, MAX_STACKS_CHARS // max(1, len(stacks)))
    mark = "\n(cut to {} characters)"
    return {
        rank: text if len(text) <= share else text[: share - len(mark.format(share))] + mark.format(share)
        for rank, text in stacks.items()
    }

"""Whether a worker's TCP connections are retransmitting: the evidence that a collective which
every rank waits in is stalled by a lossy network, not hung.

Under packet loss TCP retransmits a lost segment after its retransmission timeout (RTO, 200 ms
at first) and doubles the timeout at each loss in a row, so a few losses of one segment stall a
gloo collective for seconds (0.2 + 0.4 + ... + 6.4 s = 12.6 s after six). The collective then
finishes by itself; restarting the ranks would not make the link any better. A collective that
is truly stuck (a rank that never posts its half, a mismatched collective) has nothing in flight.

The kernel says which: ``/proc/<pid>/net/tcp`` (and ``tcp6``) lists every socket of the
process's network namespace with ``tx_queue``, the bytes written and not yet acknowledged, the
timer running (1: retransmission), and ``retrnsmt``, the retransmission timeouts that fired in a
row; ``/proc/<pid>/fd`` names the sockets a process holds (``socket:[inode]``).

``retrnsmt`` alone misses most stalls: it drops back to 0 at any acknowledgement of new data,
so a lossy connection reads 0 most of the time while its data waits
(seen between two test hosts at 10% loss: a connection whose data stayed unacknowledged for
seconds read 0 in most samples). A socket is therefore counted as waiting on the network when
it holds unacknowledged data under the retransmission timer at two reads some time apart (a
healthy link acknowledges within a round trip, far less than the gap), or when a timeout fired.
A collective that is truly stuck has nothing unacknowledged: every byte posted was delivered.
``Waiting.parse`` and ``stalled`` are the pure part (tested on hand-built tables); ``read``
reads ``/proc``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Collection, Iterable
from dataclasses import dataclass

TABLES = ("tcp", "tcp6")
# A /proc/net/tcp row split on whitespace: sl local remote st tx:rx tr:when retrnsmt uid timeout inode
_QUEUES, _TIMER, _RETRANSMITS, _INODE = 4, 5, 6, 9
_RETRANSMIT_TIMER = 1  # (2: keepalive, 4: zero-window probe: the receiver reads nothing, no loss)


@dataclass(frozen=True)
class Waiting:
    """A read of some processes' sockets: those with data not yet acknowledged under the
    retransmission timer, and those whose retransmission timeout fired and was not recovered."""

    unacked: frozenset[int] = frozenset()
    timed_out: frozenset[int] = frozenset()

    @staticmethod
    def parse(table: str, inodes: Collection[int]) -> Waiting:
        """The sockets ``inodes`` of the ``/proc/net/tcp`` text ``table`` that wait."""
        unacked, timed_out = set(), set()
        for line in table.splitlines()[1:]:
            fields = line.split()
            if len(fields) <= _INODE:
                continue
            with contextlib.suppress(ValueError):
                inode = int(fields[_INODE])
                if inode not in inodes:
                    continue
                if int(fields[_RETRANSMITS], 16) > 0:
                    timed_out.add(inode)
                tx_queue, timer = (
                    int(fields[_QUEUES].split(":")[0], 16),
                    int(fields[_TIMER].split(":")[0], 16),
                )
                if tx_queue > 0 and timer == _RETRANSMIT_TIMER:
                    unacked.add(inode)
        return Waiting(frozenset(unacked), frozenset(timed_out))

    def __or__(self, other: Waiting) -> Waiting:
        return Waiting(self.unacked | other.unacked, self.timed_out | other.timed_out)


def stalled(before: Waiting, after: Waiting) -> int:
    """How many sockets wait on the network: data unacknowledged at both reads, or a
    retransmission timeout fired by the later one."""
    return len((before.unacked & after.unacked) | after.timed_out)


def socket_inodes(pid: int) -> set[int]:
    """The inodes of the sockets process ``pid`` holds (empty when it is gone)."""
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(int(target[8:-1]))
    return inodes


def with_descendants(pids: Iterable[int]) -> list[int]:
    """``pids`` and every process below them (a worker started through a wrapper, such as a
    shell script, holds its connections in a child), from ``/proc/<pid>/task/<tid>/children``."""
    found, todo = [], list(pids)
    while todo:
        pid = todo.pop()
        found.append(pid)
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/children") as f:
                    todo += [int(child) for child in f.read().split()]
    return found


def read(pids: Iterable[int]) -> Waiting:
    """The waiting sockets of the processes ``pids`` and their descendants (read from each one's
    own network namespace; a process that is gone holds none)."""
    found = Waiting()
    for pid in with_descendants(pids):
        inodes = socket_inodes(pid)
        if not inodes:
            continue
        for table in TABLES:
            with contextlib.suppress(OSError), open(f"/proc/{pid}/net/{table}") as f:
                found |= Waiting.parse(f.read(), inodes)
    return found

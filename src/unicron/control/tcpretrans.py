"""Whether a worker's TCP connections are retransmitting: the evidence that a collective which
every rank waits in is stalled by a lossy network, not hung.

Under packet loss TCP retransmits a lost segment after its retransmission timeout (RTO, 200 ms
at first) and doubles the timeout at each loss in a row, so a few losses of one segment stall a
gloo collective for seconds (0.2 + 0.4 + ... + 6.4 s = 12.6 s after six). The collective then
finishes by itself; restarting the ranks would not make the link any better. A collective that
is truly stuck (a rank that never posts its half, a mismatched collective) has nothing in flight.

The kernel says which: ``/proc/<pid>/net/tcp`` (and ``tcp6``) lists every socket of the
process's network namespace with ``retrnsmt``, the number of retransmission timeouts that fired
in a row and have not been recovered from (acknowledged) yet; ``/proc/<pid>/fd`` names the
sockets a process holds (``socket:[inode]``). A socket of a worker with ``retrnsmt`` > 0 is a
connection waiting on TCP's backoff. ``stalled`` is the pure part (tested on hand-built tables);
``retransmitting`` reads ``/proc``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Collection, Iterable

TABLES = ("tcp", "tcp6")
# A /proc/net/tcp row split on whitespace: sl local remote st tx:rx tr:when retrnsmt uid timeout inode
_RETRANSMITS, _INODE = 6, 9


def stalled(table: str, inodes: Collection[int]) -> int:
    """How many of the sockets ``inodes`` in the ``/proc/net/tcp`` text ``table`` wait on a
    retransmission timeout that fired and was not recovered from."""
    count = 0
    for line in table.splitlines()[1:]:
        fields = line.split()
        if len(fields) <= _INODE:
            continue
        with contextlib.suppress(ValueError):
            if int(fields[_INODE]) in inodes and int(fields[_RETRANSMITS], 16) > 0:
                count += 1
    return count


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


def retransmitting(pids: Iterable[int]) -> int:
    """How many TCP connections of the processes ``pids`` and their descendants wait on a
    retransmission (read from each one's own network namespace; a process that is gone counts
    nothing)."""
    count = 0
    for pid in with_descendants(pids):
        inodes = socket_inodes(pid)
        if not inodes:
            continue
        for table in TABLES:
            with contextlib.suppress(OSError), open(f"/proc/{pid}/net/{table}") as f:
                count += stalled(f.read(), inodes)
    return count

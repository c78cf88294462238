"""The connections a process group opened, and cutting them under a group that is let go.

A gloo group's connections outlive ``destroy_process_group`` while anything still refers to the
group: a collective's ``Work`` does (it holds the group's gloo context), and so does an exception
whose frames hold one. A gloo group abandoned while a collective on it is pending
(``Peers.abandon``) is even kept alive on purpose: destroying it waits for the collective, which
waits for a peer that may never answer. Either way a peer whose own collective waits on this rank
never learns that the rank has gone. It waits in the collective, or in ``destroy_process_group``
for its collectives still running, until the process group's timeout or this process's exit.
This was seen: survivors held 7 to 20 s past the recovery's deadline, and their healthy nodes
isolated. Cutting also ends this rank's own collectives blocked on such a peer. Measured with
two ranks: one destroys its group while holding a completed ``Work``; the other's collective
waits out the group's timeout, and fails at once when the connections are cut first. So a group
is cut whenever it is left (``Peers.leave``) or abandoned (``Peers.abandon``).

Cutting the group's connections (``shutdown`` of their sockets, which stay allocated and owned
by the group) tells every peer at once, as a dead process's closed sockets do. gloo has no call
for it, so the sockets are found as the ones the group's formation opened: the process's sockets
listed in ``/proc/self/fd`` before and after. While the group forms, the session's own thread is
inside that call, and no other thread opens a TCP connection.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

Opened = frozenset[tuple[int, str]]  # (descriptor, "socket:[inode]"): the same socket still


def sockets() -> Opened:
    """This process's sockets, each with the kernel's name for it."""
    found = set()
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/self/fd/{name}")
                if target.startswith("socket:["):
                    found.add((int(name), target))
    return frozenset(found)


def opened_by(form: Callable[[], T]) -> tuple[T, Opened]:
    """``form()``'s result, and the sockets it opened."""
    before = sockets()
    made = form()
    return made, sockets() - before


def cut(opened: Opened) -> int:
    """Shut down each TCP connection of ``opened`` still open under the same descriptor (both
    ways: the peer reads the end of the stream, a blocked receive here returns); how many were
    cut."""
    done = 0
    for fd, name in opened:
        try:
            if os.readlink(f"/proc/self/fd/{fd}") != name:
                continue  # closed since, and the descriptor reused
            held = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        with held:  # (closes the duplicate only)
            if connection(held):
                with contextlib.suppress(OSError):
                    held.shutdown(socket.SHUT_RDWR)
                    done += 1
    return done


def connection(held: socket.socket) -> bool:
    """Whether ``held`` is a TCP connection. Not a listener: gloo's listening thread ends the
    process when its socket fails (an ``accept`` that fails is an enforce failure: abort)."""
    if held.family not in (socket.AF_INET, socket.AF_INET6) or held.type != socket.SOCK_STREAM:
        return False
    try:
        return not held.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
    except OSError:
        return False

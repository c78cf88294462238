"""The leftover check's own parts (bench/leftovers.py), on this process."""

from __future__ import annotations

import os
import socket

from bench.leftovers import listening_ports


def test_a_port_this_process_listens_on_is_seen_and_one_closed_is_not() -> None:
    """Listing this process's descriptors opens one more, gone before it is read: every other
    must still be seen (none was, so a port a test left listening in the test process was
    never reported)."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        assert port in listening_ports([os.getpid()])
    assert port not in listening_ports([os.getpid()])

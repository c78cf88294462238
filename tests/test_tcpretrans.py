"""A stall on a lossy link told from a hang: the retransmission count read from /proc (a
hand-built table, then a real connection between two test hosts whose packets are dropped), and
the grace it earns (pure)."""

from __future__ import annotations

import os
import select
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from harness.netfaults import FaultyHosts
from unicron.control.agent.tcpretrans import Waiting, read, stalled
from unicron.control.detect.detection import Grace
from unicron.control.detect.peercheck import PeerCheck, outcome
from unicron.control.launch.testhosts import unavailable
from unicron.core.protocol import StacksReport
from unicron.core.settings import Settings

HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
ROW = (
    "   {sl}: 0100007F:1F40 0100007F:D2F0 01 {tx:08X}:00000000 {timer:02X}:00000010 {retries:08X}  0  0"
    " {inode} 1 0 20 4 30 10 -1\n"
)


def table(*rows: tuple[int, int, int, int]) -> str:
    """A /proc/net/tcp text with a row per (inode, bytes unacknowledged, timer, timeouts fired)."""
    return HEADER + "".join(
        ROW.format(sl=i, inode=n, tx=tx, timer=timer, retries=r) for i, (n, tx, timer, r) in enumerate(rows)
    )


def test_a_socket_waits_on_the_network_with_data_unacknowledged_at_both_reads_or_a_timeout() -> None:
    before = Waiting.parse(
        table(
            (101, 0, 0, 0),  # idle
            (102, 4096, 1, 0),  # data in flight under the retransmission timer
            (103, 4096, 1, 0),  # in flight at the first read only: acknowledged since
            (104, 4096, 4, 0),  # a zero window: the receiver reads nothing, no loss
            (105, 0, 1, 0x17),  # a timeout fired (the count is hex)
            (106, 4096, 1, 0),  # someone else's socket
        ),
        {101, 102, 103, 104, 105},
    )
    assert before == Waiting(frozenset({102, 103}), frozenset({105}))
    after = Waiting.parse(
        table((102, 512, 1, 0), (103, 0, 0, 0), (104, 4096, 4, 0), (105, 0, 0, 0)), {102, 103}
    )
    assert stalled(before, after) == 1  # 102: unacknowledged at both reads, although retrnsmt is 0
    assert stalled(after, before) == 2  # 102 at both, and 105's timeout in the later read
    assert stalled(before, Waiting.parse(HEADER + "   0: garbled\n", {101})) == 0


def test_a_grace_is_renewed_only_for_a_stall_seen_retransmitting_a_few_times_under_the_cap() -> None:
    limits = Settings(network_grace_renewals=2)
    once, renewable = Grace(12, 130.0, False), Grace(12, 130.0, True)
    assert once.again(13, 2.0, limits) and renewable.again(13, 2.0, limits)  # a later step: checked anew
    assert not once.again(12, 15.0, limits)  # graced once: now the stall is handled
    assert renewable.again(12, 15.0, limits)
    assert not renewable.again(12, 300.0, limits)  # a stall as long as the cap is stuck all the same
    # Renewed twice: the third grace for the same step is not given; a later step starts afresh.
    renewed = renewable.following(12, 140.0, True).following(12, 150.0, True)
    assert renewed.renewals == 2 and not renewed.again(12, 40.0, limits)
    assert renewed.again(13, 2.0, limits) and renewed.following(13, 160.0, True).renewals == 0
    assert not renewable.again(12, 15.0, Settings(network_grace_renewals=0))


def check(retransmitting: dict[str, int]) -> PeerCheck:
    ranks = {"a": {0, 1}, "b": {2, 3}}
    found = PeerCheck("lm", 3, 12, 100.0, "every rank waits", 105.0, ranks)
    for node in ranks:
        found.add(StacksReport(task="lm", generation=3, node=node, stacks={}, unreachable=[],
                               retransmitting=retransmitting.get(node)))  # fmt: skip
    return found


def test_the_check_makes_the_grace_renewable_when_some_node_saw_retransmissions() -> None:
    assert outcome(check({"a": 0, "b": 2}), 10.0).renewable
    quiet = outcome(check({"a": 0, "b": 0}), 10.0)
    assert quiet.grace_s == 10.0 and not quiet.renewable
    assert not outcome(check({}), 10.0).renewable  # agents from before the count: once, as before
    assert outcome(check({"a": 1}), 0.0).grace_s == 0.0  # the grace turned off stays off


# It says when it listens, and when the first data has come.
SINK = (
    "import socket,sys\ns=socket.create_server((sys.argv[1],7001))\nprint('listening',flush=True)\n"
    "c,_=s.accept()\nc.recv(65536)\nprint('receiving',flush=True)\nwhile c.recv(65536): pass\n"
)
SOURCE = (
    "import socket,sys,time\nc=socket.create_connection((sys.argv[1],7001),timeout=60)\n"
    "print('up',flush=True)\nwhile True:\n    c.sendall(b'x'*4096); time.sleep(0.05)\n"
)


def retransmitting(pids: list[int], gap_s: float = 0.25) -> int:
    """The agent's count: two reads of the processes' sockets ``gap_s`` apart (it reads before
    and after its stack dump)."""
    before = read(pids)
    time.sleep(gap_s)
    return stalled(before, read(pids))


@pytest.mark.skipif(unavailable() is not None, reason=f"no test hosts here: {unavailable()}")
@pytest.mark.skipif(shutil.which("nft") is None, reason="nftables missing (make test installs it)")
@pytest.mark.timeout(120)
def test_a_connection_whose_packets_are_lost_is_seen_retransmitting_and_then_not() -> None:
    with FaultyHosts(2) as hosts:
        sink_host, source_host = hosts["h1"], hosts["h0"]
        argv = hosts.command(sink_host, [sys.executable, "-c", SINK, sink_host.address])
        sink = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        assert line_of(sink, 10) == "listening\n", "the sink did not listen within 10 s"
        # The sender runs under a shell that waits for it (as a worker started by a wrapper
        # script): its connection is counted from the shell's pid.
        wrapped = f"{sys.executable} -c {shlex.quote(SOURCE)} {sink_host.address}; exit $?"
        argv = hosts.command(source_host, ["sh", "-c", wrapped])
        source = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, start_new_session=True)
        try:
            assert source.stdout is not None and source.stdout.readline() == "up\n"
            assert line_of(sink, 10) == "receiving\n", "no data reached the sink within 10 s"
            assert retransmitting([source.pid]) == 0  # data flows and is acknowledged
            hosts.lose(sink_host, 100)
            assert wait_for(lambda: retransmitting([source.pid]) == 1, 10), "no retransmission seen"
            # Its data is seen unacknowledged in the kernel's own table (the count that does not
            # drop to 0 at a partial acknowledgement), not only the timeouts fired.
            assert read([source.pid]).unacked, "unacknowledged data not seen"
            assert retransmitting([sink.pid]) == 0  # the receiver has nothing in flight
            hosts.lose(sink_host, 0)
            # The next retransmission gets through: acknowledged, the count is back to 0.
            recovered = wait_for(lambda: retransmitting([source.pid]) == 0, 20)
            assert recovered, "the retransmission never got through"
        finally:
            os.killpg(source.pid, signal.SIGKILL)  # the shell and the sender under it
            sink.kill()
            source.wait(10)
            sink.wait(10)
    assert retransmitting([source.pid]) == 0  # a process that is gone counts nothing


def line_of(process: subprocess.Popen[str], timeout_s: float) -> str:
    """The next line ``process`` prints, or "" if none comes within ``timeout_s``."""
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], timeout_s)
    return process.stdout.readline() if ready else ""


def wait_for(predicate: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False

"""The worker's report channel to its agent, over a real Unix datagram socket whose queue holds
few datagrams: a step's report does not wait for the agent to read, nothing queued is lost, and
a report sent at once (a fault about to strike, an exception) arrives after the queued ones."""

from __future__ import annotations

import json
import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from unicron.core.protocol import FaultReport, IterationReport
from unicron.train.channel import ReportChannel


@pytest.mark.timeout(60)
def test_step_reports_do_not_wait_for_the_agent_and_arrive_in_order(tmp_path: Path) -> None:
    path = tmp_path / "agent.sock"
    agent = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    agent.bind(str(path))
    channel = ReportChannel(str(path))
    steps = 50  # five times what the socket queues by default (net.unix.max_dgram_qlen)
    for step in range(1, steps + 1):  # the agent reads nothing meanwhile: a blocking send hangs
        report = IterationReport(task="t", generation=1, rank=0, step=step, duration_s=0.1, samples=4)
        channel.send_soon(report)
    agent.settimeout(10)
    with ThreadPoolExecutor(1) as pool:  # the agent starts reading only now
        reading = pool.submit(lambda: [json.loads(agent.recv(65536)) for _ in range(steps + 1)])
        fault = FaultReport(task="t", generation=1, rank=0, step=steps + 1, action="kill", time=0.0)
        channel.send(fault)  # sent at once, but after what was queued before it
        received = reading.result(timeout=30)
    channel.close()
    agent.close()
    assert [r["step"] for r in received[:steps]] == list(range(1, steps + 1))
    assert (received[-1]["type"], received[-1]["step"]) == ("fault", steps + 1)

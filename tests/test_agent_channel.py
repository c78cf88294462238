"""The agent's channel to the coordinator (``control/agent/agent.py``) against a coordinator
played here through httpx's mock transport: what it sends after a request that failed."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from unicron.control.agent.agent import Agent, busy
from unicron.control.agent.backlog import Backlog
from unicron.core.protocol import (
    CheckpointReport,
    FaultReport,
    Heartbeat,
    HeartbeatReply,
    OrderBatch,
    RegistrationReply,
)

INTERVAL_S = 0.05


def test_only_a_coordinator_reached_but_late_is_asked_again_without_a_registration() -> None:
    request = httpx.Request("POST", "http://coordinator/v1/agents/heartbeat")
    assert busy(httpx.ReadTimeout("busy", request=request))
    assert busy(httpx.WriteTimeout("busy", request=request))
    assert not busy(httpx.ConnectTimeout("unreachable", request=request))
    assert not busy(httpx.ConnectError("refused", request=request))
    assert not busy(RuntimeError("registration refused: ..."))


def test_a_heartbeat_that_timed_out_is_sent_again_saying_how_long_it_had_no_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A coordinator too busy to answer one heartbeat in time: the agent sends a heartbeat again
    to the same coordinator, not to the next address (a standby here, which refuses), and not
    after a registration (which would add to its load and make that heartbeat's wait tell it
    nothing of its lag); the heartbeat says how long the agent has had no answer."""
    paths: list[str] = []
    beats: list[Heartbeat] = []

    async def coordinator(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if request.url.host == "standby":
            raise httpx.ConnectError("connection refused", request=request)
        if path.endswith("/orders"):
            await asyncio.sleep(INTERVAL_S)
            return httpx.Response(200, content=OrderBatch().model_dump_json())
        paths.append(path.rsplit("/", 1)[-1])
        if path.endswith("/register"):
            reply = RegistrationReply(node="n", heartbeat_interval_s=INTERVAL_S, heartbeat_deadline_s=1.0)
            return httpx.Response(200, content=reply.model_dump_json())
        beats.append(Heartbeat.model_validate_json(request.content))
        if len(beats) == 2:
            await asyncio.sleep(0.3)  # the time it took to read it, then the agent gave up
            raise httpx.ReadTimeout("the coordinator is too busy", request=request)
        return httpx.Response(200, content=HeartbeatReply(registered=True).model_dump_json())

    real = httpx.AsyncClient

    def client(**kwargs: Any) -> httpx.AsyncClient:
        return real(transport=httpx.MockTransport(coordinator), **kwargs)

    monkeypatch.setattr(httpx, "AsyncClient", client)
    agent = Agent("http://coordinator,http://standby", "n", 1, tmp_path / "agent")

    async def main() -> None:
        running = asyncio.create_task(agent.run())
        for _ in range(1000):  # a deadline of 10 s, polled
            if len(beats) >= 4 or running.done():
                break
            await asyncio.sleep(0.01)
        agent.stopping = True
        await asyncio.wait_for(running, 10)

    asyncio.run(main())
    assert paths[:5] == ["register", "heartbeat", "heartbeat", "heartbeat", "heartbeat"], paths
    assert beats[2].waited_s is not None and beats[2].waited_s >= 0.3  # no answer since the first


def test_an_injected_faults_record_wakes_the_channel_and_a_checkpoint_waits_for_the_beat() -> None:
    """A fault may take its agent down with the record before the next beat (a hang then a kill,
    a node lost): its record goes at once, as an exit's does; a checkpoint's waits its turn."""
    backlog = Backlog()
    backlog.add(CheckpointReport(task="t", generation=1, rank=0, step=10, path="step-10"))
    assert not backlog.urgent.is_set()
    backlog.add(FaultReport(task="t", generation=1, rank=0, step=10, action="hang", time=1.0))
    assert backlog.urgent.is_set() and len(backlog.reports) == 2

"""The agent's channel to the coordinator (``control/agent/agent.py``) against a coordinator
played here through httpx's mock transport: what it sends after a request that failed."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
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


class Played:
    """A coordinator played through httpx's mock transport: it registers the node at
    INTERVAL_S, answers long polls with no orders, and answers each heartbeat with ``answer``
    (given the heartbeats so far, the last one included); ``standby`` refuses connections.
    What the agent sent: the paths' last parts and the heartbeats."""

    def __init__(self, answer: Callable[[list[Heartbeat], httpx.Request], Awaitable[HeartbeatReply]]) -> None:
        self.answer, self.paths, self.beats = answer, list[str](), list[Heartbeat]()

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if request.url.host == "standby":
            raise httpx.ConnectError("connection refused", request=request)
        if path.endswith("/orders"):
            await asyncio.sleep(INTERVAL_S)
            return httpx.Response(200, content=OrderBatch().model_dump_json())
        self.paths.append(path.rsplit("/", 1)[-1])
        if path.endswith("/register"):
            reply = RegistrationReply(node="n", heartbeat_interval_s=INTERVAL_S, heartbeat_deadline_s=1.0)
            return httpx.Response(200, content=reply.model_dump_json())
        self.beats.append(Heartbeat.model_validate_json(request.content))
        return httpx.Response(200, content=(await self.answer(self.beats, request)).model_dump_json())

    def run(self, agent: Agent, beats: int, monkeypatch: pytest.MonkeyPatch) -> None:
        """Run ``agent`` against this coordinator until it sent ``beats`` heartbeats (10 s at most)."""
        real = httpx.AsyncClient

        def client(**kwargs: Any) -> httpx.AsyncClient:
            return real(transport=httpx.MockTransport(self), **kwargs)

        monkeypatch.setattr(httpx, "AsyncClient", client)

        async def main() -> None:
            running = asyncio.create_task(agent.run())
            for _ in range(1000):  # a deadline of 10 s, polled
                if len(self.beats) >= beats or running.done():
                    break
                await asyncio.sleep(0.01)
            agent.stopping = True
            await asyncio.wait_for(running, 10)

        asyncio.run(main())


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

    async def answer(beats: list[Heartbeat], request: httpx.Request) -> HeartbeatReply:
        if len(beats) == 2:
            await asyncio.sleep(0.3)  # the time it took to read it, then the agent gave up
            raise httpx.ReadTimeout("the coordinator is too busy", request=request)
        return HeartbeatReply(registered=True)

    played = Played(answer)
    played.run(Agent("http://coordinator,http://standby", "n", 1, tmp_path / "agent"), 4, monkeypatch)
    paths, beats = played.paths, played.beats
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


def test_reports_a_coordinator_did_not_read_go_again_after_the_registration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A coordinator that does not know the node (a new leader, or it declared the node lost)
    answers a heartbeat without reading its reports: the agent registers again and sends them
    in the heartbeat after (they were dropped as if delivered)."""

    async def answer(beats: list[Heartbeat], request: httpx.Request) -> HeartbeatReply:
        return HeartbeatReply(registered=len(beats) != 1)  # the first reaches one that forgot the node

    agent = Agent("http://coordinator", "n", 1, tmp_path / "agent")
    fault = FaultReport(task="t", generation=1, rank=0, step=10, action="hang", time=1.0)
    agent.backlog.add(fault)
    played = Played(answer)
    played.run(agent, 3, monkeypatch)
    paths, beats = played.paths, played.beats
    assert paths[:4] == ["register", "heartbeat", "register", "heartbeat"], paths
    assert beats[0].reports == [fault] and beats[1].reports == [fault], beats[:2]
    assert beats[2].reports == [] and agent.backlog.reports == []

"""The agents' lean path answers a heartbeat only once what it must not run ahead of is durable:
the orders it carries, and the reports it brought (the agent drops them once answered, so a
leader killed between answering and writing would lose an exit, an error or a fault's record).
A plain heartbeat, or one with steps' reports only (the next step's supersedes each), is
answered at once. In process, through the ASGI layer, with a runtime whose
store never catches up until told to."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from unicron.control.service.agentchannel import BEAT, AgentChannel
from unicron.control.service.guard import Guard
from unicron.control.service.revocation import Revocations
from unicron.control.service.tokens import issue
from unicron.core.access import Role
from unicron.core.errors import UnicronError
from unicron.core.protocol import (
    ExitReport,
    Heartbeat,
    HeartbeatReply,
    IterationReport,
    Order,
    StopWorkers,
    WorkerReport,
)

SECRET = b"s" * 32


class Behind:
    """The service's runtime as the channel sees it: a coordinator that answers with ``orders``,
    and a store whose writes are durable only once ``caught_up`` is set."""

    def __init__(self, orders: list[Order]) -> None:
        self.orders, self.caught_up, self.waited = orders, asyncio.Event(), 0

    @property
    def c(self) -> Behind:  # the coordinator: only ``heartbeat`` is asked
        return self

    def heartbeat(self, beat: Heartbeat) -> HeartbeatReply:
        return HeartbeatReply(orders=self.orders)

    async def durable(self) -> None:
        self.waited += 1
        await self.caught_up.wait()


async def answered(runtime: Behind, beat: Heartbeat, tmp_path: Path) -> bool:
    """Whether the heartbeat is answered while the store is behind (then it is let catch up)."""

    async def app(scope: object, receive: object, send: object) -> None:
        raise AssertionError("the agents' routes never reach the app")

    def status_of(exc: UnicronError) -> int:
        return 400

    channel = AgentChannel(app, Guard(SECRET, Revocations(tmp_path)), runtime, status_of)  # type: ignore[arg-type]
    token = issue(SECRET, Role.AGENT, beat.node)
    transport = httpx.ASGITransport(app=channel)
    async with httpx.AsyncClient(transport=transport, base_url="http://coordinator") as client:
        request = asyncio.ensure_future(
            client.post(BEAT, content=beat.model_dump_json(), headers={"authorization": f"Bearer {token}"})
        )
        done, _ = await asyncio.wait({request}, timeout=0.5)  # a bound: the answer needs no more
        runtime.caught_up.set()
        response = await asyncio.wait_for(request, 10)
    assert response.status_code == 200, response.text
    return bool(done)


EXIT = ExitReport(task="t", generation=1, rank=0, node="node-0", code=1, signal=None)
STOP = StopWorkers(task="t", generation=1)
STEP = IterationReport(task="t", generation=1, rank=0, step=5, duration_s=0.1, samples=8)


@pytest.mark.parametrize(
    ("reports", "orders", "at_once"),
    [
        ([], [], True),
        ([STEP], [], True),
        ([EXIT], [], False),
        ([STEP, EXIT], [], False),
        ([], [STOP], False),
        ([EXIT], [STOP], False),
    ],
    ids=["plain", "steps", "reports", "a-step-and-an-exit", "orders", "both"],
)
def test_a_heartbeat_is_answered_once_what_it_carries_is_durable(
    reports: list[WorkerReport], orders: list[Order], at_once: bool, tmp_path: Path
) -> None:
    runtime = Behind(orders)
    beat = Heartbeat(node="node-0", reports=reports)
    assert asyncio.run(answered(runtime, beat, tmp_path)) is at_once
    assert runtime.waited == (0 if at_once else 1)

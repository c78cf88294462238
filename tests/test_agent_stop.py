"""An agent's stop of its workers signals only processes that are still its own."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from unicron.control.agent.agent import Agent
from unicron.control.agent.processes import Worker
from unicron.core.protocol import LaunchWorker, StopWorkers


def test_a_worker_that_ended_while_its_stop_waited_for_the_stack_dumps_is_not_signalled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop first waits for the stack dumps under way (the hung worker's stack matters most);
    a worker that ended meanwhile is not signalled: its process id, once reaped, is free, and
    may since lead another process group on the machine (before, it was sent SIGKILL as a
    group all the same)."""
    signalled: list[tuple[int, int]] = []
    real_killpg = os.killpg

    def killpg(pgid: int, sig: int) -> None:
        signalled.append((pgid, sig))
        real_killpg(pgid, sig)

    async def scenario() -> int:
        agent = Agent("http://coordinator", "n", 1, tmp_path / "agent")
        process = await asyncio.create_subprocess_exec(sys.executable, "-c", "pass", start_new_session=True)
        order = LaunchWorker(task="t", generation=1, rank=0, world_size=1, local_rank=0, argv=["p"])
        agent.supervisor.workers[("t", 1, 0)] = Worker(order, process, tmp_path / "w.log")
        dump: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        agent.supervisor.dumps.add(dump)  # a stack dump under way
        stop = asyncio.ensure_future(agent.supervisor.stop(StopWorkers(task="t", generation=1, grace_s=0.0)))
        await asyncio.wait_for(process.wait(), 60)  # the worker ends while the stop waits
        dump.set_result(None)
        await asyncio.wait_for(stop, 60)
        return process.pid

    monkeypatch.setattr(os, "killpg", killpg)
    pid = asyncio.run(scenario())
    assert [s for s in signalled if s[0] == pid] == []

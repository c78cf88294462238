"""Processes are signalled only while they are still the signaller's own (an agent's workers, a
local cluster's agents), and a local cluster says which of its processes ended and how."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from unicron.control.agent.agent import Agent
from unicron.control.agent.processes import Worker
from unicron.control.launch.localcluster import LocalCluster
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


def test_a_local_clusters_wait_that_times_out_says_which_of_its_processes_ended_and_how(
    tmp_path: Path,
) -> None:
    """A test waiting on a cluster whose coordinator vanished is told so, and by what signal
    (before: only "timed out", a coordinator gone without a word left nothing to go on)."""
    cluster = LocalCluster(tmp_path / "cluster", nodes=1)  # not started: its processes are set here
    gone = subprocess.Popen([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
    gone.wait(60)
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    cluster.coordinators, cluster.agents = {0: gone}, {"node-0": running}
    try:
        with pytest.raises(TimeoutError, match=r"ended meanwhile: coordinator 0 \(killed by SIGKILL\)$"):
            cluster.wait(lambda: False, 0.2, "nothing")
    finally:
        running.kill()
        running.wait(60)

"""A worker that ends before its first step (a bad path, an import, an argument: its script's own
error, which the library never saw) is reported by its agent with its output file and the file's
last lines; one that trained, or that was stopped, without. The agent in process, one real
worker process each (``python -c``), no coordinator."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from unicron.control.agent.agent import Agent
from unicron.control.agent.processes import log_tail
from unicron.core.protocol import (
    LOG_TAIL_CHARS,
    LOG_TAIL_LINES,
    ExitReport,
    IterationReport,
    LaunchWorker,
    StopWorkers,
)


def test_the_tail_is_the_last_lines_bounded(tmp_path: Path) -> None:
    log = tmp_path / "w.log"
    assert log_tail(log) == ""  # none yet
    log.write_text("".join(f"line {i}\n" for i in range(1000)))
    assert log_tail(log).splitlines() == [f"line {i}" for i in range(1000 - LOG_TAIL_LINES, 1000)]
    log.write_text("short\n" + "x" * 5000 + "\nlast\n")
    tail = log_tail(log)
    assert len(tail) == LOG_TAIL_CHARS and tail.endswith("x\nlast")
    log.write_bytes("é".encode() * 3000)  # multi-byte, cut anywhere: still text
    assert log_tail(log) == "é" * LOG_TAIL_CHARS


def run_worker(tmp_path: Path, code: str, step: bool = False, stop: bool = False) -> ExitReport:
    """Launch ``python -c code`` through an agent and return the exit it reports; ``step``: the
    worker reports a step first (its report reaches the agent); ``stop``: the coordinator
    stops it."""
    agent = Agent("http://127.0.0.1:9", "n0", 1, tmp_path / "agent")
    order = LaunchWorker(
        task="t", generation=3, rank=0, world_size=1, local_rank=0, argv=[sys.executable, "-c", code]
    )

    async def main() -> ExitReport:
        await agent.supervisor.launch(order)
        if step:
            stepped = IterationReport(task="t", generation=3, rank=0, step=1, duration_s=0.1, samples=1)
            agent.supervisor.heard(stepped)
        if stop:
            await agent.supervisor.stop(StopWorkers(task="t", grace_s=5.0))
        for _ in range(3000):  # the exit is reported at once: a deadline of 30 s, polled
            exits = [r for r in agent.backlog.reports if isinstance(r, ExitReport)]
            if exits:
                return exits[0]
            await asyncio.sleep(0.01)
        raise AssertionError("no exit reported within 30 s")

    return asyncio.run(main())


def test_an_exit_before_the_first_step_carries_the_output(tmp_path: Path) -> None:
    failing = "import sys; print('loading data/train.bin'); sys.exit(\"no such file: 'data/train.bin'\")"
    report = run_worker(tmp_path, failing)
    assert report.code == 1 and report.log is not None and Path(report.log).is_absolute()
    assert report.log == str((tmp_path / "agent" / "logs" / "t-g3-r0.log").absolute())
    assert report.log_tail == "loading data/train.bin\nno such file: 'data/train.bin'"


def test_an_exit_after_a_step_or_a_stop_carries_none(tmp_path: Path) -> None:
    waits = "import time; time.sleep(0.3)"  # long enough for the step's report to come first
    trained = run_worker(tmp_path / "a", waits, step=True)
    assert (trained.code, trained.log, trained.log_tail) == (0, None, None)
    stopped = run_worker(tmp_path / "b", "import time; time.sleep(60)", stop=True)
    assert stopped.stop_ordered and (stopped.log, stopped.log_tail) == (None, None)

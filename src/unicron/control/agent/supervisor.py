"""The node's worker processes: started, watched, stopped, renamed in place, asked for their
stacks, and their reports taken.

- Workers are started in their own process group with everything they need in their
  environment, and with a parent-death signal so that they die with the agent (a lost node).
  A Python worker is forked from a server that has imported torch already (``warmstart.py``):
  a process a recovery starts costs a fork, not seconds of imports.
- Each exit is seen the moment it happens (asyncio's child watcher, or its fork server's report)
  with its code or signal.
- A stop order sends SIGTERM to the worker's group and SIGKILL after the grace period.
- Workers send reports as JSON datagrams to the agent's Unix socket; they go to the backlog
  (``backlog.py``) that the heartbeats carry. Their positions are not messages: each worker's
  board is read when it is listed (``processes.py``).
- An exited worker stays listed until its exit has been sent (the coordinator takes a running
  worker its node stops listing for one lost), at most ``MAX_LISTED_WORKERS``.

What it is told to do comes from the coordinator through the channel (``agent.py``), which is
the only part that speaks to the coordinator.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from unicron.control.agent import logfiles, stackdump
from unicron.control.agent.agentmetrics import AgentMetrics
from unicron.control.agent.backlog import Backlog
from unicron.control.agent.hostaddress import NodeAddress
from unicron.control.agent.processes import Supervised, Worker, dies_with_parent, log_tail
from unicron.control.agent.warmstart import WarmStarts
from unicron.control.private import private_log
from unicron.core.limits import MAX_LISTED_WORKERS
from unicron.core.protocol import (
    AGENT_DATAGRAM,
    DumpStacks,
    ExitReport,
    ForgetTask,
    IterationReport,
    LaunchFailedReport,
    LaunchWorker,
    RenameWorkers,
    StopWorkers,
    StoreMoved,
    WorkerReport,
    WorkerState,
)
from unicron.core.workerenv import STORE_MOVES_KEPT, WorkerEnv, host_checkpoint_dir


@dataclass
class Supervisor:
    node: str
    run_dir: Path
    socket_path: Path  # where the workers send their reports
    backlog: Backlog
    store_hosts: list[str]  # the coordinators' hosts (a worker reaches its task's store there)
    gpus: list[str] = field(default_factory=list)
    where: NodeAddress = field(default_factory=NodeAddress)
    metrics: AgentMetrics = field(default_factory=AgentMetrics)
    workers: dict[tuple[str, int, int], Worker] = field(init=False, default_factory=dict)
    # ended tasks whose workers here still run
    forgotten: dict[str, ForgetTask] = field(init=False, default_factory=dict)
    dumps: set[asyncio.Task[None]] = field(init=False, default_factory=set)  # stacks being read: a stop waits
    _tasks: set[asyncio.Task[None]] = field(init=False, default_factory=set)
    warm: WarmStarts = field(init=False)

    def __post_init__(self) -> None:
        self.warm = WarmStarts(self.run_dir / "logs")

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ------------------------------------------------------------------ reports from workers
    class _Datagrams(asyncio.DatagramProtocol):
        def __init__(self, supervisor: Supervisor) -> None:
            self.supervisor = supervisor

        def datagram_received(self, data: bytes, addr: Any) -> None:
            try:
                message = AGENT_DATAGRAM.validate_json(data)
            except ValidationError:
                return
            self.supervisor.heard(message)

    async def listen(self) -> asyncio.BaseTransport:
        """Take the workers' reports on the node's Unix socket (a stale one is replaced)."""
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(
            lambda: self._Datagrams(self), local_addr=str(self.socket_path), family=1
        )
        return transport

    def heard(self, report: WorkerReport) -> None:
        """A worker's report: to the backlog (a step also tells that its worker got that far:
        its exit is then no failure to start)."""
        if isinstance(report, IterationReport):
            worker = self.workers.get((report.task, report.generation, report.rank))
            if worker is not None:
                worker.stepped = True
        self.backlog.add(report)

    def running(self) -> int:
        return sum(not w.exited for w in self.workers.values())

    async def launch(self, order: LaunchWorker) -> None:
        """Start a worker. One that cannot be started (no such program, no permission) is
        reported as such; the agent goes on serving its other orders and heartbeats."""
        key = (order.task, order.generation, order.rank)
        if key in self.workers:
            return
        argv = list(order.argv)
        if argv and argv[0] == "python":
            argv[0] = sys.executable
        log = self._log_path(order)
        try:
            env = self._worker_env(order)
            with private_log(log):  # (created private: a forked worker appends to it)
                pass
            process = await self.warm.launch(argv, env, log) or await start_new(argv, env, log)
        except (OSError, ValueError) as exc:
            error = f"{type(exc).__name__}: {exc}"[:500]
            print(f"agent {self.node}: cannot start {argv[:1]} for {key}: {error}", file=sys.stderr)
            self.backlog.add(
                LaunchFailedReport(
                    task=order.task,
                    generation=order.generation,
                    rank=order.rank,
                    node=self.node,
                    error=error,
                    time=time.time(),
                )
            )
            return
        worker = Worker(order, process, log)
        self.workers[key] = worker
        self.metrics.launched(order)
        self._spawn(self._watch(worker))

    def _log_path(self, order: LaunchWorker) -> Path:
        """The worker's output; its stack dumps go beside it (``Worker.stack_file``)."""
        return logfiles.log_path(self.run_dir, order.task, order.generation, order.rank)

    def _worker_env(self, order: LaunchWorker) -> dict[str, str]:
        """The coordinator's part of the worker contract with the node's part added."""
        contract = WorkerEnv.from_env(order.env) or WorkerEnv(task=order.task)
        mine = contract.model_copy(
            update={
                "rank": order.rank,
                "world_size": order.world_size,
                "node": self.node,
                "local_rank": order.local_rank,
                "agent_socket": str(self.socket_path),
                "agent_pid": os.getpid(),
                "store_hosts": ",".join(self.store_hosts),
                "store_file": str(self._store_file(order.task)),
                "stack_file": str(self._log_path(order).with_suffix(".stacks")),
                "position_file": str(self._log_path(order).with_suffix(".position")),
            }
        )
        # The node's interface first: an operator's own GLOO_SOCKET_IFNAME, or the task's, wins.
        env = {**self.where.worker_env(), **os.environ, **order.env, **mine.to_env()}
        # torch.distributed's own names, for scripts and libraries that read them.
        env.update(
            {
                "RANK": str(order.rank),
                "LOCAL_RANK": str(order.local_rank),
                "WORLD_SIZE": str(order.world_size),
                "PYTHONUNBUFFERED": "1",
            }
        )
        if self.gpus:
            env["CUDA_VISIBLE_DEVICES"] = self.gpus[order.local_rank % len(self.gpus)]
        return env

    async def _watch(self, worker: Worker) -> None:
        code = await worker.process.wait()
        last = worker.progress  # read before its board goes
        worker.exited = True
        with contextlib.suppress(OSError):
            worker.board.unlink()
        o = worker.order
        # Ended on its own before its first step: the script's own error, which the library
        # never saw (a bad path, an import, an argument). Its output's end tells what it was.
        told = not worker.stop_ordered and not worker.stepped
        report = ExitReport(
            task=o.task,
            generation=o.generation,
            rank=o.rank,
            node=self.node,
            code=code if code >= 0 else None,
            signal=-code if code < 0 else None,
            time=time.time(),
            stop_ordered=worker.stop_ordered,
            reached=last.generation if last else o.generation,
            log=os.path.abspath(worker.log)[:4096] if told else None,  # (PATH_MAX: never cut)
            log_tail=log_tail(worker.log) if told else None,
        )
        self.metrics.exited(report)
        self.backlog.add(report)
        if o.task in self.forgotten:
            self.forget_task(self.forgotten[o.task])

    async def stop(self, order: StopWorkers) -> None:
        chosen = [
            w
            for (task, gen, rank), w in self.workers.items()
            if task == order.task
            and (
                order.generation is None
                or (gen == order.generation if order.rank is not None else gen <= order.generation)
            )
            and (order.rank is None or rank == order.rank)
            and not w.exited
        ]
        await asyncio.gather(*(self._terminate(w, order.grace_s) for w in chosen))

    def dump_stacks(self, order: DumpStacks) -> None:
        """Have every live worker of the task write its Python stack and report them
        (``stackdump``): begun now, in turn with the other orders, and finished beside them."""
        dump = self._spawn(self._report_stacks(stackdump.begin(order, self.node, self.workers.values())))
        self.dumps.add(dump)
        dump.add_done_callback(self.dumps.discard)

    async def _report_stacks(self, dump: stackdump.StackDump) -> None:
        try:
            self.backlog.add(await stackdump.finish(dump))
        except Exception as exc:  # the orders' loops go on: say it, as they do
            print(f"agent {self.node}: stack dump failed: {exc!r}", file=sys.stderr)

    async def _terminate(self, worker: Worker, grace_s: float) -> None:
        worker.stop_ordered = True
        # The dumps under way first: the hung worker's stack is the one that matters.
        await asyncio.gather(*self.dumps, return_exceptions=True)
        if grace_s > 0:
            _signal_group(worker, signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(worker.process.wait(), grace_s)
                return
        _signal_group(worker, signal.SIGKILL)
        await worker.process.wait()

    def forget_exited(self) -> None:
        """Let go of exited workers whose exits the coordinator has been sent: each a minute after
        it started, and at once the oldest past ``MAX_LISTED_WORKERS`` (a node in a crash loop).
        One whose exit report still waits (a backlog) stays listed: the coordinator takes a
        running worker that its node's list lacks for one lost (``control/detect/vanished.py``)."""
        waiting = self.backlog.exits_waiting()
        told = [k for k, w in self.workers.items() if w.exited and k not in waiting]
        excess, now = len(self.workers) - MAX_LISTED_WORKERS, time.time()
        for index, key in enumerate(told):
            if index < excess or now - self.workers[key].started > 60:
                del self.workers[key]

    def listed(self) -> list[WorkerState]:
        """The workers a registration or heartbeat lists: every one, running or exited, within
        ``MAX_LISTED_WORKERS`` (running ones first, should exits waiting to be sent ever fill it);
        an exited one whose exit report still waits in the backlog says so."""
        self.forget_exited()
        waiting = self.backlog.exits_waiting()
        ordered = sorted(self.workers.items(), key=lambda kw: kw[1].exited)[:MAX_LISTED_WORKERS]
        return [w.state(exit_unsent=w.exited and key in waiting) for key, w in ordered]

    def forget_task(self, order: ForgetTask) -> None:
        """Remove the node's in-memory checkpoints of an ended task (and their folder if empty),
        again once its last worker here exits: one still saving its final state (rank 0 reports
        the end before the others' last writes) would otherwise leave a copy nobody frees."""
        path = host_checkpoint_dir(order.checkpoint_dir, self.node, order.host_checkpoint_root)
        shutil.rmtree(path, ignore_errors=True)
        with contextlib.suppress(OSError):
            path.parent.rmdir()
        live = any(task == order.task and not w.exited for (task, _, _), w in self.workers.items())
        self.forgotten.pop(order.task, None)
        with contextlib.suppress(OSError):
            self._store_file(order.task).unlink()  # (a task of the name submitted again starts afresh)
        if live:
            self.forgotten[order.task] = order

    def _store_file(self, task: str) -> Path:
        """Where the task's workers here read where its store moved (``WorkerEnv.store_file``)."""
        return self.run_dir / "stores" / task

    def store_moved(self, order: StoreMoved) -> None:
        """Tell the task's workers here where its store is served now: a line added after the
        moves before it (a worker that missed one follows them all: ``train/storeaddress.py``),
        the file written whole (a worker reading it meanwhile reads it before the move or after,
        never half of it)."""
        path = self._store_file(order.task)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            earlier = path.read_text().splitlines()
        except FileNotFoundError:
            earlier = []
        moves = [*earlier, f"{order.moved_from} {order.address}"][-STORE_MOVES_KEPT:]
        written = path.with_name(f".{order.task}.{os.getpid()}")
        written.write_text("\n".join(moves) + "\n")
        os.replace(written, path)

    def rename(self, order: RenameWorkers) -> None:
        for rank, new_rank in order.ranks.items():
            worker = self.workers.pop((order.task, order.generation, rank), None)
            if worker is None:
                continue
            renamed = {"generation": order.new_generation, "rank": new_rank}
            worker.order = worker.order.model_copy(update=renamed)
            self.workers[(order.task, order.new_generation, new_rank)] = worker
            logfiles.link_renamed(worker.log, self.run_dir, order.task, order.new_generation, new_rank)

    async def shutdown(self, grace_s: float = 5.0) -> None:
        """Stop every worker still running (the agent is stopping), then the fork servers."""
        await asyncio.gather(*(self._terminate(w, grace_s) for w in self.workers.values() if not w.exited))
        await self.warm.close()


async def start_new(argv: list[str], env: dict[str, str], log: Path) -> Supervised:
    """The worker as a new interpreter: its own session, its output appended to ``log``, dying
    with the agent."""
    with private_log(log) as out:
        return await asyncio.create_subprocess_exec(
            *argv,
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
            stdin=asyncio.subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            preexec_fn=dies_with_parent(signal.SIGKILL),
        )


def _signal_group(worker: Worker, sig: int) -> None:
    """Signal the worker's process group unless the worker is known to have ended: it may have
    ended while the stack dumps were awaited, and its id, once reaped, is free for any process
    of the machine to lead a group with."""
    if worker.exited or worker.process.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(worker.process.pid, sig)

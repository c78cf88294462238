"""The node agent: registers its node, heartbeats, runs and supervises worker processes.

- Workers are started in their own process group with everything they need in their
  environment, and with a parent-death signal so that they die with the agent (a lost node).
- Each exit is seen the moment it happens (asyncio's child watcher) with its code or signal.
- A stop order sends SIGTERM to the worker's group and SIGKILL after the grace period.
- Workers send reports as JSON datagrams to the agent's Unix socket; the agent forwards them
  with the next heartbeat, at once for urgent ones (exits, exceptions). Their positions are not
  messages: the agent reads each worker's board when it heartbeats (``control.processes``).
- A heartbeat holds what the coordinator takes in one (``core/limits.py``): at most
  ``MAX_REPORTS_PER_BEAT`` reports within the body's limit, the oldest first, the rest in the
  heartbeats that follow at once (a backlog after a partition); at most ``MAX_LISTED_WORKERS``
  workers listed, the oldest exited ones let go first once their exits are reported.
- When the coordinator is unreachable the agent keeps its workers running, keeps their reports,
  and registers again when the coordinator answers.
- Each worker's output goes to a file in its run folder; the coordinator reads part of one with a
  ``ReadLog`` order, answered in the background (``logfiles``: ``unicron logs``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from pydantic import ValidationError

from unicron.control.agent import logfiles, peerprobe, stackdump
from unicron.control.agent.agentmetrics import AgentMetrics
from unicron.control.agent.hostaddress import NodeAddress
from unicron.control.agent.processes import Worker, dies_with_parent, log_tail
from unicron.control.private import private_log
from unicron.control.service.credentials import Credentials
from unicron.core.cadence import jittered
from unicron.core.coordinators import Coordinators
from unicron.core.limits import MAX_BODY_BYTES, MAX_LISTED_WORKERS, MAX_REPORTS_PER_BEAT
from unicron.core.protocol import (
    AGENT_DATAGRAM,
    AGENT_REQUEST_TIMEOUT_S,
    AGENT_RETRY_CAP_S,
    WORKER_REPORT,
    DumpStacks,
    ExceptionReport,
    ExitReport,
    ForgetTask,
    Heartbeat,
    HeartbeatReply,
    IterationReport,
    LaunchFailedReport,
    LaunchWorker,
    OrderBatch,
    ReadLog,
    Registration,
    RegistrationReply,
    RenameWorker,
    StacksReport,
    StopWorkers,
    WorkerReport,
    WorkerState,
)
from unicron.core.reachability import Reachability, describe
from unicron.core.workerenv import WorkerEnv, host_checkpoint_dir

MAX_BUFFERED_REPORTS = 10_000


# A Unix socket's path is at most 107 bytes (Linux's sun_path, less its NUL).
MAX_SOCKET_PATH = 107


def socket_path(run_dir: Path) -> Path:
    """Where the agent takes its workers' reports: in its run folder, or, where that path would
    be too long for a Unix socket (a deep ``--run-dir``), in the temporary folder under a name
    made from the run folder's (the same one for an agent started again there)."""
    inside = run_dir / "agent.sock"
    if len(os.fsencode(inside)) <= MAX_SOCKET_PATH:
        return inside
    digest = hashlib.sha256(os.fsencode(run_dir.resolve())).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"unicron-agent-{digest}.sock"


class Agent:
    def __init__(
        self,
        coordinator: str,
        node: str,
        slots: int,
        run_dir: Path,
        gpus: list[str] | None = None,
        where: NodeAddress | None = None,
        credentials: Credentials | None = None,
        metrics: AgentMetrics | None = None,
        domain: str | None = None,
    ) -> None:
        self.coordinators = Coordinators.of(coordinator)
        self.domain = domain  # the failure domain it shares with other nodes (``--domain``)
        self.metrics = metrics or AgentMetrics()  # served only when asked (``run_agent``)
        self.credentials = credentials or Credentials()  # an agent token for this node, the CA
        self.node = node
        self.slots = slots
        self.gpus = gpus or []
        self.where = where or NodeAddress()
        self.run_dir = run_dir
        self.socket_path = socket_path(run_dir)
        self.workers: dict[tuple[str, int, int], Worker] = {}
        self.forgotten: dict[str, ForgetTask] = {}  # ended tasks whose workers here still run
        self.reports: list[WorkerReport] = []
        self.urgent = asyncio.Event()
        self.interval = 0.5
        self.registered = False
        self.answered_at = time.monotonic()  # the last heartbeat the coordinator answered
        self.stopping = False
        self.acked = 0  # the number of the last order carried out
        # Retries back off while the coordinator does not answer (capped: a node must come back
        # within seconds of its network), and the log says so once, not once per beat.
        self.link = Reachability(
            f"the coordinator at {self.coordinators}", base_s=0.5, cap_s=AGENT_RETRY_CAP_S
        )
        self.probe_port = 0  # the peer-probe listener's, once it listens (run)
        self.dumps: set[asyncio.Task[None]] = set()  # stacks being read: a stop waits for them
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        """The coordinator the next request goes to (the leader, once found)."""
        return self.coordinators.current

    def _say(self, line: str | None) -> None:
        if line is not None:
            print(f"agent {self.node}: {line}", file=sys.stderr, flush=True)

    def _paced(self, interval_s: float) -> None:
        """Beat every ``interval_s`` from now on: the coordinator's pace for the cluster's size
        (``core/cadence.py``), said when it changes."""
        if interval_s != self.interval:
            self._say(f"heartbeat every {interval_s:g} s (the coordinator's pace for the cluster's size)")
        self.interval = interval_s

    def _spawn(self, coroutine: Any) -> asyncio.Task[None]:
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ------------------------------------------------------------------ reports from workers
    class _Datagrams(asyncio.DatagramProtocol):
        def __init__(self, agent: Agent) -> None:
            self.agent = agent

        def datagram_received(self, data: bytes, addr: Any) -> None:
            try:
                message = AGENT_DATAGRAM.validate_json(data)
            except ValidationError:
                return
            self.agent.queue(message)

    def queue(self, report: WorkerReport) -> None:
        if isinstance(report, IterationReport):
            worker = self.workers.get((report.task, report.generation, report.rank))
            if worker is not None:
                worker.stepped = True
        self.reports.append(report)
        del self.reports[:-MAX_BUFFERED_REPORTS]
        if isinstance(report, (ExitReport, ExceptionReport, LaunchFailedReport, StacksReport)):
            self.urgent.set()

    # ------------------------------------------------------------------ workers
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
            with private_log(log) as out:
                process = await asyncio.create_subprocess_exec(
                    *argv,
                    stdout=out,
                    stderr=asyncio.subprocess.STDOUT,
                    stdin=asyncio.subprocess.DEVNULL,
                    env=env,
                    start_new_session=True,
                    preexec_fn=dies_with_parent(signal.SIGKILL),
                )
        except (OSError, ValueError) as exc:
            error = f"{type(exc).__name__}: {exc}"[:500]
            print(f"agent {self.node}: cannot start {argv[:1]} for {key}: {error}", file=sys.stderr)
            self.queue(
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
                "store_hosts": ",".join(urlsplit(u).hostname or "" for u in self.coordinators.urls),
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
        self.queue(report)
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
            self.queue(await stackdump.finish(dump))
        except Exception as exc:  # the orders' loops go on: say it, as they do
            print(f"agent {self.node}: stack dump failed: {exc!r}", file=sys.stderr)

    async def _terminate(self, worker: Worker, grace_s: float) -> None:
        worker.stop_ordered = True
        # The dumps under way first: the hung worker's stack is the one that matters.
        await asyncio.gather(*self.dumps, return_exceptions=True)
        if grace_s > 0:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(worker.process.pid, signal.SIGTERM)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(worker.process.wait(), grace_s)
                return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.process.pid, signal.SIGKILL)
        await worker.process.wait()

    def forget_exited(self) -> None:
        """Let go of exited workers whose exits the coordinator has been sent: each a minute after
        it started, and at once the oldest past ``MAX_LISTED_WORKERS`` (a node in a crash loop).
        One whose exit report still waits (a backlog) stays listed: the coordinator takes a
        running worker that its node's list lacks for one lost (``control/detect/vanished.py``)."""
        waiting = {(r.task, r.generation, r.rank) for r in self.reports if isinstance(r, ExitReport)}
        told = [k for k, w in self.workers.items() if w.exited and k not in waiting]
        excess, now = len(self.workers) - MAX_LISTED_WORKERS, time.time()
        for index, key in enumerate(told):
            if index < excess or now - self.workers[key].started > 60:
                del self.workers[key]

    def listed(self) -> list[WorkerState]:
        """The workers a registration or heartbeat lists: every one, running or exited, within
        ``MAX_LISTED_WORKERS`` (running ones first, should exits waiting to be sent ever fill it)."""
        self.forget_exited()
        ordered = sorted(self.workers.values(), key=lambda w: w.exited)[:MAX_LISTED_WORKERS]
        return [w.state() for w in ordered]

    # ------------------------------------------------------------------ the coordinator
    async def _register(self, client: httpx.AsyncClient) -> None:
        reg = Registration(
            node=self.node,
            slots=self.slots,
            gpus=self.gpus,
            host=self.where.address,
            probe_port=self.probe_port,
            workers=self.listed(),
            domain=self.domain,
        )
        response = await client.post(f"{self.url}/v1/agents/register", content=reg.model_dump_json())
        if response.status_code != 200:
            raise RuntimeError(f"registration refused: {response.text}")
        reply = RegistrationReply.model_validate_json(response.content)
        self._paced(reply.heartbeat_interval_s)
        self.registered = True
        self.answered_at = time.monotonic()  # (a registration is an answer)
        self._say(registered_line(self.url))

    async def _beat(self, client: httpx.AsyncClient) -> bool:
        """One heartbeat, with as many of the oldest reports as it holds; True when more wait."""
        workers = self.listed()
        sent, waited = time.time(), time.monotonic() - self.answered_at
        bare = Heartbeat(node=self.node, workers=workers, acked=self.acked, sent=sent, waited_s=waited)
        room = MAX_BODY_BYTES - len(bare.model_dump_json().encode())
        count = batch_size(self.reports, room)
        while count == 0 and self.reports:  # one that can never be sent (none is: ``batch_size``)
            dropped = self.reports.pop(0)
            self._say(f"a {dropped.type} report of {dropped.task} too large to send was dropped")
            count = batch_size(self.reports, room)
        sending = self.reports[:count]
        hb = bare.model_copy(update={"reports": sending})
        began = time.monotonic()
        response = await client.post(f"{self.url}/v1/agents/heartbeat", content=hb.model_dump_json())
        response.raise_for_status()
        self.answered_at = time.monotonic()
        self.metrics.beat(time.monotonic() - began, sending, time.time())
        del self.reports[:count]
        reply = HeartbeatReply.model_validate_json(response.content)
        if reply.heartbeat_interval_s is not None:
            self._paced(reply.heartbeat_interval_s)
        if not reply.registered:
            self.registered = False
            return False
        await self._carry_out(reply.orders, reply.numbers)
        return bool(self.reports)

    async def _carry_out(self, orders: list[Any], numbers: list[int]) -> None:
        """Carry orders out, once each: one sent again (its first answer was lost, or the
        heartbeat and the long poll both brought it) is skipped."""
        fresh = [o for o, n in zip(orders, numbers, strict=True) if n > self.acked]
        self.acked = max([self.acked, *numbers])
        for order in fresh:
            if isinstance(order, LaunchWorker):
                await self.launch(order)
            elif isinstance(order, RenameWorker):
                self.rename(order)
            elif isinstance(order, ForgetTask):
                self.forget_task(order)
            elif isinstance(order, DumpStacks):
                self.dump_stacks(order)
            elif isinstance(order, ReadLog):
                self._spawn(self._answer_log(order))
            else:
                self._spawn(self.stop(order))

    async def _answer_log(self, order: ReadLog) -> None:
        """Answer the coordinator's ``ReadLog`` (``unicron logs``) with part of a worker's log."""
        try:
            workers, own = self.workers.values(), self.credentials
            await logfiles.answer(order, self.node, self.run_dir, workers, self.url, own)
        except Exception as exc:  # the coordinator's wait ends the request; the orders go on
            self._say(f"could not answer a read of {order.task}'s log: {describe(exc)}")

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
        if live:
            self.forgotten[order.task] = order

    def rename(self, order: RenameWorker) -> None:
        worker = self.workers.pop((order.task, order.generation, order.rank), None)
        if worker is not None:
            worker.order = worker.order.model_copy(
                update={"generation": order.new_generation, "rank": order.new_rank}
            )
            self.workers[(order.task, order.new_generation, order.new_rank)] = worker
            logfiles.link_renamed(worker.log, self.run_dir, order.task, order.new_generation, order.new_rank)

    async def _poll_orders(self) -> None:
        """Long poll: the coordinator answers as soon as it has an order for this node, so a
        stop reaches the survivors of a failure at once rather than at the next heartbeat."""
        own = self.credentials
        async with httpx.AsyncClient(headers=own.headers, verify=own.verify) as client:
            while not self.stopping:
                if not self.registered:
                    await asyncio.sleep(self.interval / 2)
                    continue
                try:
                    wait = self.interval * 4  # (the interval grows with the cluster: core/cadence.py)
                    response = await client.get(
                        f"{self.url}/v1/agents/{self.node}/orders",
                        params={"wait": wait, "acked": self.acked},
                        timeout=wait + 2,
                    )
                    response.raise_for_status()
                    batch = OrderBatch.model_validate_json(response.content)
                    await self._carry_out(batch.orders, batch.numbers)
                except httpx.HTTPError:
                    await asyncio.sleep(self.interval)
                except Exception as exc:  # never let one order end the loop that serves them all
                    print(f"agent {self.node}: order failed: {exc!r}", file=sys.stderr)
                    await asyncio.sleep(self.interval)

    async def run(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(
            lambda: self._Datagrams(self), local_addr=str(self.socket_path), family=1
        )
        headers = {"content-type": "application/json", **self.credentials.headers}
        probe = await peerprobe.listen(self.where.address)  # peers check they can reach this node
        self.probe_port = probe.sockets[0].getsockname()[1]
        self._spawn(self._poll_orders())
        try:
            async with httpx.AsyncClient(
                timeout=AGENT_REQUEST_TIMEOUT_S, headers=headers, verify=self.credentials.verify
            ) as client:
                while not self.stopping:
                    wait = jittered(self.interval)
                    try:
                        if not self.registered:
                            await self._register(client)
                        if await self._beat(client):
                            wait = 0.0  # a backlog: the next heartbeat at once
                        self.coordinators.answered()
                        self._say(self.link.reached(time.monotonic()))
                    except (httpx.HTTPError, RuntimeError) as exc:
                        self.registered = False
                        self.metrics.reachable.set(0)
                        if self.coordinators.failed():  # every address failed: back off
                            wait, line = self.link.failed(time.monotonic(), exc)
                            self._say(line)
                        else:
                            wait = 0.0
                    except Exception as exc:  # the heartbeat must go on whatever one beat hit
                        print(f"agent {self.node}: heartbeat failed: {exc!r}", file=sys.stderr)
                    self.metrics.workers.set(sum(not w.exited for w in self.workers.values()))
                    self.urgent.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.urgent.wait(), wait)
        finally:
            transport.close()
            probe.close()
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()  # (in the temporary folder, nothing else would)

    async def shutdown(self, grace_s: float = 5.0) -> None:
        self.stopping = True
        await asyncio.gather(*(self._terminate(w, grace_s) for w in self.workers.values() if not w.exited))


def batch_size(reports: list[WorkerReport], room: int) -> int:
    """How many of the oldest ``reports`` one heartbeat carries: at most MAX_REPORTS_PER_BEAT, in
    ``room`` bytes of JSON (the body's limit less the rest of the heartbeat). Each report's texts
    are bounded (``core/protocol.py``), the largest a stacks report of MAX_STACKS_CHARS, so one
    always fits beside the longest list of workers."""
    size = 0
    for count, report in enumerate(reports[:MAX_REPORTS_PER_BEAT]):
        size += len(WORKER_REPORT.dump_json(report)) + 1  # (and a comma)
        if size > room:
            return count
    return min(len(reports), MAX_REPORTS_PER_BEAT)


def run_agent(
    coordinator: str,
    node: str,
    slots: int,
    run_dir: Path,
    gpus: list[str] | None = None,
    credentials: Credentials | None = None,
    where: NodeAddress | None = None,
    metrics_port: int | None = None,
    domain: str | None = None,
) -> None:
    """Run the agent until SIGTERM or SIGINT (exit 0), or until its loop fails (exit 1), saying
    what it is, where it reports, and when and why it stops."""
    metrics, where = AgentMetrics(), where or NodeAddress()

    async def main() -> str | None:
        agent = Agent(coordinator, node, slots, run_dir, gpus, where, credentials, metrics, domain)
        for line in started_lines(node, slots, gpus or [], str(agent.coordinators), where, run_dir):
            agent._say(line)
        if domain is not None:
            agent._say(f"failure domain {domain}")
        if metrics_port is not None:  # on the node's address (loopback without one)
            try:
                port = metrics.serve(where.address, metrics_port)
            except OSError as exc:  # a port in use: said plainly, not as a traceback
                agent._say(f"stopped: cannot serve metrics on {where.address}:{metrics_port} ({exc})")
                return str(exc)
            agent._say(f"metrics at http://{where.address}:{port}/metrics")
        return await until_stopped(agent)

    if asyncio.run(main()) is not None:
        sys.exit(1)


def started_lines(
    node: str, slots: int, gpus: list[str], coordinator: str, where: NodeAddress, run_dir: Path
) -> list[str]:
    """What an agent says when it starts, one fact a line (the docs show them as printed:
    tests/test_live_start_stop.py)."""
    return [
        f"started as node {node}",
        f"slots {slots}",
        f"GPUs {','.join(gpus)}"
        if gpus
        else "GPUs none assigned (no --gpus): a worker takes the one at its local rank, else the CPU",
        f"coordinator {coordinator}",
        f"address {where.address} (where other nodes reach its workers)",
        f"worker logs in {run_dir.absolute() / 'logs'}",
    ]


async def until_stopped(agent: Agent) -> str | None:
    """Run ``agent`` until a signal, or until its loop fails (it would otherwise wait for a
    signal with nothing running), then stop its workers, saying why. Returns the error that
    ended it, None when a signal did."""
    loop = asyncio.get_running_loop()
    signalled: asyncio.Future[str] = loop.create_future()

    def on_signal(sig: signal.Signals) -> None:  # called from the loop: safe to print
        if not signalled.done():
            signalled.set_result(f"{sig.name} received")

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    runner = asyncio.create_task(agent.run())
    either: set[asyncio.Future[Any]] = {runner, signalled}
    await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
    error = None
    if not signalled.done():
        failure = runner.exception()
        error = describe(failure) if failure is not None else "its loop ended"
    live = sum(not w.exited for w in agent.workers.values())
    why = signalled.result() if error is None else f"error: {error}"
    agent._say(stopping_line(why, live))
    await agent.shutdown()
    runner.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):  # (its error is said above)
        await runner
    agent._say(STOPPED)
    return error


def registered_line(url: str) -> str:
    return f"registered with the coordinator at {url}"


def stopping_line(why: str, workers: int) -> str:
    return f"stopping: {why}" + (f" ({workers} workers to stop)" if workers else "")


STOPPED = "stopped"

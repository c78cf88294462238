"""The node agent: registers its node with the coordinator, heartbeats, and carries out the
coordinator's orders through its supervision of the workers (``supervisor.py``).

This module is the channel to the coordinator, the only part of the agent that speaks to it:

- A heartbeat lists the node's workers and carries the backlog of reports (``backlog.py``):
  at most ``MAX_REPORTS_PER_BEAT`` reports within the body's limit (``core/limits.py``), the
  oldest first, the rest in the heartbeats that follow at once (a backlog after a partition); an
  urgent report (an exit, an exception) is sent at once.
- Orders come with the heartbeat's answer and by a long poll (a stop reaches the survivors of a
  failure at once), each carried out once.
- The agent beats at the coordinator's pace (``core/cadence.py``), jittered; when the
  coordinator is unreachable it keeps its workers running, keeps their reports, backs off, and
  registers again when the coordinator answers.
- Each worker's output goes to a file in its run folder; the coordinator reads part of one with a
  ``ReadLog`` order, answered in the background (``logfiles``: ``unicron logs``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import signal
import sys
import tempfile
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from unicron.control.agent import logfiles, peerprobe
from unicron.control.agent.agentmetrics import AgentMetrics
from unicron.control.agent.backlog import Backlog
from unicron.control.agent.hostaddress import NodeAddress
from unicron.control.agent.supervisor import Supervisor
from unicron.control.service.credentials import Credentials
from unicron.core.cadence import jittered
from unicron.core.coordinators import Coordinators
from unicron.core.limits import MAX_BODY_BYTES
from unicron.core.protocol import (
    AGENT_REQUEST_TIMEOUT_S,
    AGENT_RETRY_CAP_S,
    DumpStacks,
    ForgetTask,
    Heartbeat,
    HeartbeatReply,
    LaunchWorker,
    Order,
    OrderBatch,
    ReadLog,
    Registration,
    RegistrationReply,
    RenameWorkers,
    StoreMoved,
)
from unicron.core.reachability import Reachability, describe

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
        warm_start: bool = True,
        fork_template: Path | None = None,
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
        self.backlog = Backlog()
        hosts = [urlsplit(u).hostname or "" for u in self.coordinators.urls]
        self.supervisor = Supervisor(
            node, run_dir, socket_path(run_dir), self.backlog, hosts, self.gpus, self.where, self.metrics
        )
        # Python workers forked from a server that has imported torch (``warmstart.py``).
        self.supervisor.warm.enabled = warm_start
        self.supervisor.warm.template = fork_template  # a local cluster's (``template.py``)
        self.interval = 0.5
        self.registered = False
        self.answered_at = time.monotonic()  # the last heartbeat the coordinator answered
        self.stopping = False
        self.acked = 0  # the number of the last order taken (carried out in turn: ``_carry_out``)
        self.orders_in: asyncio.Queue[Order] = asyncio.Queue()
        # Retries back off while the coordinator does not answer (capped: a node must come back
        # within seconds of its network), and the log says so once, not once per beat.
        self.link = Reachability(
            f"the coordinator at {self.coordinators}", base_s=0.5, cap_s=AGENT_RETRY_CAP_S
        )
        self.probe_port = 0  # the peer-probe listener's, once it listens (run)
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

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _register(self, client: httpx.AsyncClient) -> None:
        reg = Registration(
            node=self.node,
            slots=self.slots,
            gpus=self.gpus,
            host=self.where.address,
            probe_port=self.probe_port,
            workers=self.supervisor.listed(),
            domain=self.domain,
            sent=time.time(),
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
        workers = self.supervisor.listed()
        sent, waited = time.time(), time.monotonic() - self.answered_at
        bare = Heartbeat(node=self.node, workers=workers, acked=self.acked, sent=sent, waited_s=waited)
        room = MAX_BODY_BYTES - len(bare.model_dump_json().encode())
        count = self.backlog.batch(room)
        while count == 0 and self.backlog.reports:  # one that can never be sent
            dropped = self.backlog.drop_oldest()
            self._say(f"a {dropped.type} report of {dropped.task} too large to send was dropped")
            count = self.backlog.batch(room)
        sending = self.backlog.reports[:count]
        hb = bare.model_copy(update={"reports": sending})
        began = time.monotonic()
        response = await client.post(f"{self.url}/v1/agents/heartbeat", content=hb.model_dump_json())
        response.raise_for_status()
        self.answered_at = time.monotonic()
        self.metrics.beat(time.monotonic() - began, sending, time.time())
        reply = HeartbeatReply.model_validate_json(response.content)
        if reply.heartbeat_interval_s is not None:
            self._paced(reply.heartbeat_interval_s)
        if not reply.registered:
            # The coordinator does not know this node (a new leader, or it was declared lost):
            # it read none of the reports; they go again once the node has registered.
            self.registered = False
            return False
        self.backlog.sent(count)
        self._take(reply.orders, reply.numbers)
        return bool(self.backlog.reports)

    def _take(self, orders: list[Order], numbers: list[int]) -> None:
        """Queue orders to be carried out, once each: one sent again (its first answer was lost,
        or the heartbeat and the long poll both brought it) is skipped."""
        fresh = [o for o, n in zip(orders, numbers, strict=True) if n > self.acked]
        self.acked = max([self.acked, *numbers])
        for order in fresh:
            self.orders_in.put_nowait(order)

    async def _carry_out(self) -> None:
        """Carry the orders out in the order they came, apart from the heartbeats and the long
        poll that bring them: a launch may wait seconds for its fork server's imports (the
        first in its environment), and the coordinator would take a node whose heartbeats
        waited that long for lost."""
        while True:
            order = await self.orders_in.get()
            try:
                if isinstance(order, LaunchWorker):
                    await self.supervisor.launch(order)
                elif isinstance(order, RenameWorkers):
                    self.supervisor.rename(order)
                elif isinstance(order, ForgetTask):
                    self.supervisor.forget_task(order)
                elif isinstance(order, DumpStacks):
                    self.supervisor.dump_stacks(order)
                elif isinstance(order, StoreMoved):
                    self.supervisor.store_moved(order)
                elif isinstance(order, ReadLog):
                    self._spawn(self._answer_log(order))
                else:
                    self._spawn(self.supervisor.stop(order))
            except Exception as exc:  # never let one order end the loop that serves them all
                print(f"agent {self.node}: order failed: {exc!r}", file=sys.stderr)

    async def _answer_log(self, order: ReadLog) -> None:
        """Answer the coordinator's ``ReadLog`` (``unicron logs``) with part of a worker's log."""
        try:
            workers, own = self.supervisor.workers.values(), self.credentials
            await logfiles.answer(order, self.node, self.run_dir, workers, self.url, own)
        except Exception as exc:  # the coordinator's wait ends the request; the orders go on
            self._say(f"could not answer a read of {order.task}'s log: {describe(exc)}")

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
                    self._take(batch.orders, batch.numbers)
                except httpx.HTTPError:
                    await asyncio.sleep(self.interval)
                except Exception as exc:  # never let one order end the loop that serves them all
                    print(f"agent {self.node}: order failed: {exc!r}", file=sys.stderr)
                    await asyncio.sleep(self.interval)

    async def run(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        transport = await self.supervisor.listen()
        headers = {"content-type": "application/json", **self.credentials.headers}
        probe = await peerprobe.listen(self.where.address)  # peers check they can reach this node
        self.probe_port = probe.sockets[0].getsockname()[1]
        self._spawn(self._carry_out())
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
                        self.metrics.reachable.set(0)
                        if busy(exc):  # reached, no answer in time: the same one, at once, then later
                            wait, line = self.link.timed_out(time.monotonic(), exc)
                            self._say(line)
                        elif self.coordinators.failed():  # every address failed: back off
                            self.registered = False
                            wait, line = self.link.failed(time.monotonic(), exc)
                            self._say(line)
                        else:
                            self.registered, wait = False, 0.0
                    except Exception as exc:  # the heartbeat must go on whatever one beat hit
                        print(f"agent {self.node}: heartbeat failed: {exc!r}", file=sys.stderr)
                    self.metrics.workers.set(self.supervisor.running())
                    self.backlog.urgent.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.backlog.urgent.wait(), wait)
        finally:
            transport.close()
            probe.close()
            with contextlib.suppress(FileNotFoundError):
                self.supervisor.socket_path.unlink()  # (in the temporary folder, nothing else would)

    async def shutdown(self, grace_s: float = 5.0) -> None:
        self.stopping = True
        await self.supervisor.shutdown(grace_s)


def busy(error: BaseException) -> bool:
    """Whether a failed request reached a coordinator that did not answer in time (a read or a
    write that timed out, not a connection that could not be made): the agent asks the same
    coordinator again (at once the first time: an answer lost on a lossy link; then after the
    link's back-off: ``Reachability.timed_out``), with a heartbeat that says how long it has had
    no answer, and does not register again (registering would cost a coordinator that is already
    late more than a heartbeat, and make the next heartbeat a first one, whose wait tells it
    nothing of its lag). Any other failure (refused, reset, a connection that timed out, a refused
    registration): the next address, and a registration. (A coordinator that has forgotten the
    node, or declared it lost, answers a heartbeat with ``registered: false``, and the agent
    registers then.)"""
    return isinstance(error, httpx.ReadTimeout | httpx.WriteTimeout)


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
    warm_start: bool = True,
    fork_template: Path | None = None,
) -> None:
    """Run the agent until SIGTERM or SIGINT (exit 0), or until its loop fails (exit 1), saying
    what it is, where it reports, and when and why it stops."""
    metrics, where = AgentMetrics(), where or NodeAddress()

    async def main() -> str | None:
        agent = Agent(
            coordinator,
            node,
            slots,
            run_dir,
            gpus,
            where,
            credentials,
            metrics,
            domain,
            warm_start,
            fork_template,
        )
        lines = started_lines(node, slots, gpus or [], str(agent.coordinators), where, run_dir, warm_start)
        for line in lines:
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
    node: str,
    slots: int,
    gpus: list[str],
    coordinator: str,
    where: NodeAddress,
    run_dir: Path,
    warm_start: bool = True,
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
        "Python workers forked from a server that has imported torch (--cold-start: new interpreters)"
        if warm_start
        else "workers started as new interpreters (--cold-start)",
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
    live = agent.supervisor.running()
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

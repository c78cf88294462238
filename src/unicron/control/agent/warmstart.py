"""Warm starts: the agent's fork servers (``forkserver.py``), one per worker environment.

A worker whose command is the agent's own interpreter running a script or a module is forked
from a server that has already imported torch; any other command starts as a new interpreter.
Servers are keyed by the worker's environment less what differs between launches (its rank, its
devices, the worker contract's variables), because modules read some variables once, when imported: a
worker never runs on modules imported under another environment.

A server is started by the first launch in its environment (forked by the local cluster's
template where the agent was given one: ``template.py``), which waits for it: the first
worker's start costs about what a new interpreter's does (the same imports, made once in the
server; a fork where a template made them), and every later one there (the node's other slots,
restarts, relaunches, newcomers, spares) is a fork. A node that runs no worker imports nothing.
Where a server cannot start, is not ready within ``READY_TIMEOUT_S`` or cannot fork, the worker
starts as a new interpreter. A server lives until the agent ends, or until another environment
needs its place once none of its workers runs; its workers die with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from unicron.control.agent.forkserver import TITLE_ROOM
from unicron.control.agent.processes import dies_with_parent
from unicron.control.agent.template import ask
from unicron.control.private import private_log
from unicron.core.workerenv import KEYS

# What a training worker imports before its first step, in the order it imports them: torch's
# modules only (Unicron's training library installs guards when imported: ``forkserver.py``).
# A task adds its own (``run.preload``, given to the agent as the contract's PRELOAD key).
PRELOAD = ("torch", "torch._dynamo", "torch.distributed", "torch.distributed.checkpoint", "torch.nn.parallel")
PRELOAD_KEY = KEYS["preload"]
# Set per launch by the agent and the coordinator (torch's names, the device, the worker
# contract); read at run time, never at import. Not the task's preload: what a server imported
# is what it is, so workers of another list get another server.
PER_LAUNCH = frozenset({"RANK", "LOCAL_RANK", "WORLD_SIZE", "CUDA_VISIBLE_DEVICES", *KEYS.values()}) - {
    PRELOAD_KEY
}
# Environments served warm at once (each server holds its imports in memory); a server with no
# worker left makes room for another environment.
MAX_SERVERS = 4
READY_TIMEOUT_S = 120.0


def warm_argv(argv: list[str], executable: str = sys.executable) -> bool:
    """Whether a fork server can run this command: the agent's interpreter with a script or
    ``-m module`` and no interpreter options (those would not be the server's)."""
    if len(argv) < 2 or argv[0] != executable:
        return False
    if argv[1] == "-m":
        return len(argv) >= 3
    return not argv[1].startswith("-")


def server_env(env: dict[str, str]) -> dict[str, str]:
    """The environment a worker's server is started with: the worker's, less what each launch
    sets."""
    return {k: v for k, v in env.items() if k not in PER_LAUNCH}


def preloaded(env: dict[str, str]) -> list[str]:
    """What a server for ``env``'s workers imports: torch's modules, then the task's own."""
    extra = [m for m in env.get(PRELOAD_KEY, "").split(",") if m]
    return list(dict.fromkeys([*PRELOAD, *extra]))


def environment_key(env: dict[str, str]) -> str:
    """Which server a worker is forked from: its ``server_env``, as a digest."""
    return hashlib.sha256(json.dumps(sorted(server_env(env).items())).encode()).hexdigest()[:16]


@dataclass
class Forked:
    """A worker forked by a server: what the agent needs of a process (``processes.Supervised``)."""

    pid: int
    returncode: int | None = None
    ended: asyncio.Event = field(default_factory=asyncio.Event)

    def end(self, code: int) -> None:
        if self.returncode is None:
            self.returncode = code
            self.ended.set()

    async def wait(self) -> int:
        await self.ended.wait()
        assert self.returncode is not None
        return self.returncode


class ServerProcess(Protocol):
    """What a fork server's process is to the agent: ``asyncio.subprocess.Process`` for one it
    started, :class:`Templated` for one a template forked."""

    stdin: asyncio.StreamWriter | None
    stdout: asyncio.StreamReader | None

    @property
    def returncode(self) -> int | None: ...

    async def wait(self) -> int: ...

    def kill(self) -> None: ...


class Templated:
    """A server the template forked (``template.py``): not the agent's child, so its end is read
    from a pidfd, and its code is not known (0, or the SIGKILL the agent sent)."""

    def __init__(self, pid: int, stdin: asyncio.StreamWriter, stdout: asyncio.StreamReader) -> None:
        self.stdin: asyncio.StreamWriter | None = stdin
        self.stdout: asyncio.StreamReader | None = stdout
        self.pidfd = os.pidfd_open(pid)
        self.ended: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.killed = False
        asyncio.get_running_loop().add_reader(self.pidfd, self._ended)

    @classmethod
    async def ask(cls, template: Path, env: dict[str, str], log: Path) -> Templated:
        """A server forked by the template at ``template``; OSError where it refuses (its
        environment differs) or does not answer."""
        loop = asyncio.get_running_loop()
        with private_log(log) as out:
            pid, orders, answers = await asyncio.to_thread(
                ask, template, env, preloaded(env), out.fileno(), READY_TIMEOUT_S
            )
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(answers, "rb", 0)
        )
        transport, protocol = await loop.connect_write_pipe(
            lambda: asyncio.StreamReaderProtocol(asyncio.StreamReader()), os.fdopen(orders, "wb", 0)
        )
        return cls(pid, asyncio.StreamWriter(transport, protocol, None, loop), reader)

    def _ended(self) -> None:
        loop = asyncio.get_running_loop()
        loop.remove_reader(self.pidfd)
        os.close(self.pidfd)
        if not self.ended.done():
            self.ended.set_result(-signal.SIGKILL if self.killed else 0)

    @property
    def returncode(self) -> int | None:
        return self.ended.result() if self.ended.done() else None

    async def wait(self) -> int:
        return await asyncio.shield(self.ended)

    def kill(self) -> None:
        if not self.ended.done():
            self.killed = True
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)


class ForkServer:
    """One server process and the workers it forked."""

    def __init__(self, process: ServerProcess) -> None:
        self.process = process
        self.ready: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self.answers: dict[int, asyncio.Future[Forked]] = {}
        self.children: dict[int, Forked] = {}  # by pid, until its exit is read
        self.orders = 0
        self.reader = asyncio.ensure_future(self._read())

    @classmethod
    async def start(cls, env: dict[str, str], log: Path, template: Path | None = None) -> ForkServer:
        """A server for ``env``'s workers: forked by the ``template`` where there is one and it
        serves this environment, else started here (OSError if it cannot be)."""
        if template is not None:
            try:
                return cls(await Templated.ask(template, env, log))
            except OSError as exc:
                print(f"warm starts: {exc}; this server imports torch itself", file=sys.stderr, flush=True)
        with private_log(log) as out:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-u",
                "-m",
                "unicron.control.agent.forkserver",
                "--preload",
                ",".join(preloaded(env)),
                *TITLE_ROOM,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=out,
                env=env,
                # A session of its own, as its workers have: a signal to the agent's process
                # group (a Ctrl-C) must leave them to the agent's graceful stop. It dies with the
                # agent, and its workers with it.
                start_new_session=True,
                preexec_fn=dies_with_parent(signal.SIGKILL),
            )
        return cls(process)

    @property
    def alive(self) -> bool:
        return self.process.returncode is None and not self.reader.done()

    async def launch(self, argv: list[str], env: dict[str, str], log: Path) -> Forked:
        """Fork a worker; OSError if the server cannot."""
        assert self.process.stdin is not None
        self.orders += 1
        answer: asyncio.Future[Forked] = asyncio.get_running_loop().create_future()
        self.answers[self.orders] = answer
        order = {"id": self.orders, "argv": argv, "env": env, "cwd": os.getcwd(), "log": str(log)}
        try:
            self.process.stdin.write(json.dumps(order).encode() + b"\n")
            await self.process.stdin.drain()
        except (ConnectionError, RuntimeError) as exc:
            raise OSError(f"the fork server is gone: {exc}") from exc
        return await answer

    async def _read(self) -> None:
        assert self.process.stdout is not None
        try:
            async for line in self.process.stdout:
                self._answer(json.loads(line))
        finally:
            self._gone()

    def _answer(self, message: dict[str, object]) -> None:
        if "ready" in message:
            if not self.ready.done():
                self.ready.set_result(bool(message["ready"]))
        elif "exit" in message:
            # (always after its pid's answer: the server reports an exit only once it reaped it)
            self.children.pop(int(str(message["exit"]))).end(int(str(message["code"])))
        else:
            answer = self.answers.pop(int(str(message["id"])))
            if "pid" in message:
                child = Forked(int(str(message["pid"])))
                self.children[child.pid] = child
                answer.set_result(child)
            else:
                answer.set_exception(OSError(str(message.get("error"))))

    def _gone(self) -> None:
        """The server is gone: so are its workers (their parent-death signal is SIGKILL)."""
        if not self.ready.done():
            self.ready.set_result(False)
        for answer in self.answers.values():
            if not answer.done():
                answer.set_exception(OSError("the fork server is gone"))
        for child in self.children.values():
            child.end(-signal.SIGKILL)

    async def close(self) -> None:
        """Let it go once its workers have ended (the agent stopped them first)."""
        if self.process.stdin is not None:
            self.process.stdin.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.process.wait(), 10)
        if self.process.returncode is None:
            self.process.kill()
            await self.process.wait()


class WarmStarts:
    """The agent's fork servers, by environment (``enabled`` False: every worker starts as a new
    interpreter, ``unicron agent --cold-start``)."""

    def __init__(self, logs: Path, enabled: bool = True, template: Path | None = None) -> None:
        self.logs = logs
        self.enabled = enabled
        self.template = template  # a template server's socket, to fork servers from (``template.py``)
        self.servers: dict[str, asyncio.Task[ForkServer | None]] = {}
        self.retiring: set[asyncio.Task[None]] = set()

    def prepare(self, env: dict[str, str]) -> asyncio.Task[ForkServer | None] | None:
        """The server for ``env``'s workers, started if need be (None: warm starts are off, or
        every slot holds a server with running workers)."""
        if not self.enabled:
            return None
        key = environment_key(env)
        task = self.servers.get(key)
        if task is not None and task.done():
            started = _started(task)
            if started is None or not started.alive:
                del self.servers[key]  # it failed or died: start another
                task = None
        if task is None:
            if len(self.servers) >= MAX_SERVERS and not self._retire_one():
                return None
            task = self.servers[key] = asyncio.ensure_future(self._start(server_env(env), key))
        return task

    async def launch(self, argv: list[str], env: dict[str, str], log: Path) -> Forked | None:
        """The worker forked from its environment's server, started and waited for if need be;
        None where it is to start as a new interpreter (not a Python program of this
        interpreter, warm starts off, no server)."""
        if not warm_argv(argv):
            return None
        task = self.prepare(env)
        if task is None:
            return None
        await asyncio.wait([task])  # (the launch's own cancellation leaves the server's start alone)
        if (server := _started(task)) is None:
            return None
        try:
            return await server.launch(argv, env, log)
        except OSError:
            return None

    def _retire_one(self) -> bool:
        """Make room for another environment: let go of a server none of whose workers runs
        (one that failed to start counts); False if every one has workers."""
        for key, task in list(self.servers.items()):
            if not task.done():
                continue
            server = _started(task)
            if server is None or not server.children:
                del self.servers[key]
                if server is not None:
                    closing = asyncio.ensure_future(server.close())
                    self.retiring.add(closing)
                    closing.add_done_callback(self.retiring.discard)
                return True
        return False

    async def _start(self, env: dict[str, str], key: str) -> ForkServer | None:
        self.logs.mkdir(parents=True, exist_ok=True)
        try:
            server = await ForkServer.start(env, self.logs / f"forkserver-{key}.log", self.template)
        except OSError:
            return None
        with contextlib.suppress(TimeoutError):
            if await asyncio.wait_for(asyncio.shield(server.ready), READY_TIMEOUT_S):
                return server
        await server.close()
        return None

    async def close(self) -> None:
        for task in self.servers.values():
            task.cancel()  # (a done one ignores it)
        started = [_started(t) for t in self.servers.values() if t.done()]
        await asyncio.gather(*(s.close() for s in started if s is not None), *self.retiring)
        self.servers.clear()


def _started(task: asyncio.Task[ForkServer | None]) -> ForkServer | None:
    """The server a finished start gave; None where there is none (it failed to start: a worker
    then starts as a new interpreter)."""
    if task.cancelled() or task.exception() is not None:
        return None
    return task.result()

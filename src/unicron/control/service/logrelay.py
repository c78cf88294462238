"""Workers' logs through the coordinator (``unicron logs``): find the node, ask its agent, wait.

As the Kubernetes API server asks the kubelet of a pod's node for its log, the coordinator asks
the agent that ran the worker, over the channel that agent already keeps open (no port of its
own, its own token, TLS when the coordinator serves it): a ``ReadLog`` order wakes the agent's
long poll, and the agent posts a ``LogChunk`` back (``control/agent/logfiles.py``).

Everything is bounded: ``LOG_CHUNK_BYTES`` per answer, ``ANSWER_WAIT_S`` for the agent to
answer, reads in flight per node and in all. A log on a lost or removed node is refused at
once, naming the node and its state; one whose agent does not answer in time, likewise.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, Field

from unicron.control.service.guard import Guard, own_node
from unicron.control.store.reads import StoreReads
from unicron.core.access import Principal
from unicron.core.errors import NotFound, Unavailable, UsageError
from unicron.core.limits import MAX_JSON_INT
from unicron.core.protocol import LOG_CHUNK_BYTES, LogChunk, ReadLog
from unicron.core.states import NodeState

if TYPE_CHECKING:
    from unicron.control.coordinator import Coordinator

ANSWER_WAIT_S = 5.0  # for an agent's answer: its long poll takes the order at once
PER_NODE, IN_ALL = 8, 64  # reads waiting for an answer: at most ~IN_ALL * LOG_CHUNK_BYTES held


class LogAnswer(BaseModel):
    """Part of a worker's log (``GET /v1/tasks/{name}/logs``)."""

    task: str
    generation: int
    rank: int
    node: str = Field(description="the node that ran the worker, where the file is")
    path: str = Field(description="the log file on that node")
    offset: int = Field(description="where `text` starts in the file, in bytes")
    next_offset: int = Field(description="where it ends: pass it as `offset` to read on (follow)")
    size: int = Field(description="the file's size when read, in bytes")
    running: bool = Field(description="a live worker still writes to it")
    capped: bool = Field(
        description=f"lines before `offset` were wanted: at most {LOG_CHUNK_BYTES} bytes a read"
    )
    text: str = Field(description="the bytes read, as UTF-8 (a bad byte shows as U+FFFD)")


class LogTaken(BaseModel):
    """The coordinator's reply to an agent's answer: False when nobody waits for it any more."""

    taken: bool


@dataclass(frozen=True)
class Located:
    """The worker whose log is read: its identity as its agent knows it, and its node."""

    task: str
    generation: int
    rank: int
    node: str

    @property
    def file(self) -> str:
        return f"{self.task}-g{self.generation}-r{self.rank}.log"


def locate(store: StoreReads, name: str, generation: int | None, rank: int) -> Located:
    """The worker of task ``name`` with ``rank`` in ``generation`` (None: the newest generation
    that had that rank), or an error naming what there is."""
    task = store.task(name)
    if task is None:
        raise NotFound(f"no task named {name!r}: `unicron status` lists the tasks")
    owner = name.partition("#")[0]  # an ended run kept as NAME#RUN: its workers stay NAME's
    first = getattr(task, "first_generation", 1)
    rows = [w for w in store.workers(owner) if first <= w.generation <= task.generation]
    if not rows:
        run = getattr(task, "run", 1)
        earlier = (
            f"; the run before is {name}#{run - 1}: `unicron logs '{name}#{run - 1}'`" if run > 1 else ""
        )
        raise NotFound(
            f"task {name!r} has no workers yet ({task.state.value}): its logs appear once it is "
            f"launched (`unicron status` shows when){earlier}"
        )
    if generation is not None:
        if generation not in (generations := {w.generation for w in rows}):
            raise NotFound(
                f"task {name!r} has no generation {generation}: {its('generation', generations)}; "
                "pass one of them to --generation (none: the newest)"
            )
        rows = [w for w in rows if w.generation == generation]
    mine = [w for w in rows if w.rank == rank]
    if not mine:
        where = f"generation {generation}" if generation is not None else "any generation"
        raise NotFound(
            f"task {name!r} has no rank {rank} in {where}: {its('rank', {w.rank for w in rows})}; "
            "pass one of them to --rank"
        )
    row = max(mine, key=lambda w: w.generation)
    return Located(owner, row.generation, row.rank, row.node)


def its(noun: str, numbers: set[int]) -> str:
    """What there is, said as "its ranks are 0-3" (with gaps: listed, the first 10) or "its only
    rank is 0"."""
    ordered = sorted(numbers)
    if len(ordered) == 1:
        return f"its only {noun} is {ordered[0]}"
    if ordered[-1] - ordered[0] + 1 == len(ordered):
        return f"its {noun}s are {ordered[0]}-{ordered[-1]}"
    return f"its {noun}s are " + ", ".join(map(str, ordered[:10])) + (", ..." if len(ordered) > 10 else "")


def reachable(store: StoreReads, where: Located, now: float) -> None:
    """Refuse at once a read from a node that cannot answer: lost, or no longer in the cluster."""
    node = store.node(where.node)
    held = f"rank {where.rank} of generation {where.generation} ran on node {where.node}"
    kept = f"its log stays on that machine: {where.file} in the logs folder of its agent's --run-dir"
    if node is None:
        raise Unavailable(f"{held}, which is no longer in the cluster (removed); {kept}")
    if node.state is NodeState.LOST:
        silent = now - node.last_seen
        raise Unavailable(
            f"{held}, which is lost (no heartbeat for {silent:.0f} s); {kept}, and readable "
            "here again once its agent is back"
        )


Received = tuple[LogChunk, bytes]


class LogRelay:
    """Reads waiting for their agents' answers, each by its request id and node."""

    def __init__(
        self,
        coordinator: Callable[[], Coordinator],
        wait_s: float = ANSWER_WAIT_S,
        per_node: int = PER_NODE,
        in_all: int = IN_ALL,
    ) -> None:
        self.coordinator, self.wait_s, self.per_node, self.in_all = coordinator, wait_s, per_node, in_all
        self.waiting: dict[str, tuple[str, asyncio.Future[Received]]] = {}

    async def read(
        self, name: str, rank: int, generation: int | None, tail: int | None, offset: int | None
    ) -> LogAnswer:
        """Part of the log of task ``name``'s ``rank`` (see ``ReadLog``), from its agent."""
        c = self.coordinator()
        where = locate(c.store, name, generation, rank)
        reachable(c.store, where, c.clock())
        request = uuid.uuid4().hex
        order = ReadLog(
            request=request,
            task=where.task,
            generation=where.generation,
            rank=where.rank,
            offset=offset,
            tail=tail,
        )
        chunk, data = await self.ask(c, where.node, order)
        if chunk.error:
            raise NotFound(chunk.error)
        return LogAnswer(
            task=name,
            generation=where.generation,
            rank=where.rank,
            node=where.node,
            path=chunk.path,
            offset=chunk.offset,
            next_offset=chunk.offset + len(data),
            size=chunk.size,
            running=chunk.running,
            capped=chunk.capped,
            text=data.decode("utf-8", errors="replace"),
        )

    async def ask(self, c: Coordinator, node: str, order: ReadLog) -> Received:
        """Send ``order`` to ``node``'s agent and wait (at most ``wait_s``) for its answer."""
        self._room(node)
        future: asyncio.Future[Received] = asyncio.get_running_loop().create_future()
        self.waiting[order.request] = (node, future)
        c.orders_out.add(node, order)  # (wakes the agent's long poll; it is no change of state)
        try:
            return await asyncio.wait_for(future, self.wait_s)
        except TimeoutError:
            raise Unavailable(self._silent(c, node)) from None
        finally:
            del self.waiting[order.request]
            # Taken back unsent if the agent never took it (an agent that does not know the
            # order would otherwise be sent it again with every heartbeat).
            queue = c.orders_out.queues.get(node)
            if queue:
                c.orders_out.queues[node] = [(n, o) for n, o in queue if o is not order]

    def _room(self, node: str) -> None:
        here = sum(n == node for n, _ in self.waiting.values())
        if here >= self.per_node or len(self.waiting) >= self.in_all:
            limit = f"{self.per_node} for node {node}" if here >= self.per_node else f"{self.in_all} in all"
            raise Unavailable(f"too many log reads wait for their agents ({limit}): try again in a moment")

    def _silent(self, c: Coordinator, node: str) -> str:
        record = c.store.node(node)
        state = "gone from the cluster" if record is None else record.state.value
        beat = "" if record is None else f", last heartbeat {c.clock() - record.last_seen:.1f} s ago"
        return (
            f"the agent on node {node} did not answer within {self.wait_s:g} s (node {state}{beat}): "
            "try again; if it keeps failing, check that agent's output"
        )

    def answered(self, node: str, chunk: LogChunk) -> bool:
        """An agent's answer: True when a read was waiting for it (from that node)."""
        entry = self.waiting.get(chunk.request)
        if entry is None or entry[0] != node or entry[1].done():
            return False
        try:
            data = base64.b64decode(chunk.data, validate=True)
        except binascii.Error:
            raise UsageError("a log chunk's data must be base64") from None
        if len(data) > LOG_CHUNK_BYTES:
            raise UsageError(f"a log chunk holds at most {LOG_CHUNK_BYTES} bytes")
        entry[1].set_result((chunk, data))
        return True


def user_routes(relay: LogRelay) -> APIRouter:
    """``GET /v1/tasks/{name}/logs``: whoever may read the tasks' state may read their logs
    (Kubernetes' view role reads pods' logs)."""
    router = APIRouter()

    @router.get("/v1/tasks/{name}/logs")
    async def logs(
        name: str,
        rank: Annotated[int, Query(ge=0, le=MAX_JSON_INT, description="the worker's rank")] = 0,
        generation: Annotated[
            int | None, Query(ge=0, le=MAX_JSON_INT, description="default: the newest that had the rank")
        ] = None,
        tail: Annotated[
            int | None,
            Query(
                ge=0,
                le=MAX_JSON_INT,
                description="the last this many lines (after `offset`, with it); default: all that fit",
            ),
        ] = None,
        offset: Annotated[
            int | None, Query(ge=0, le=MAX_JSON_INT, description="read on from this byte (a follow)")
        ] = None,
    ) -> LogAnswer:
        """Part of a worker's log, read by its agent: its end (at most the last `tail` lines),
        or from `offset` on; at most LOG_CHUNK_BYTES bytes a read."""
        return await relay.read(name, rank, generation, tail, offset)

    return router


def agent_routes(relay: LogRelay, guard: Guard) -> APIRouter:
    """``POST /v1/agents/{node}/logs``: an agent's answer to a ``ReadLog``, for its own node."""
    router = APIRouter()

    agent = Depends(guard.agent)

    @router.post("/v1/agents/{node}/logs")
    async def log_chunk(node: str, chunk: LogChunk, caller: Principal = agent) -> LogTaken:
        own_node(caller, node)
        return LogTaken(taken=relay.answered(node, chunk))

    return router

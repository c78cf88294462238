"""Workers' logs on their node: where each is, reading part of one, answering the coordinator.

Each worker's stdout and stderr go to one file in the agent's run folder,
``logs/TASK-gGENERATION-rRANK.log``, named by the identity it was launched with. A worker kept
across a recovery in place (renamed into the next generation) writes on in the same file; its
new identity's name is made a link to that file, so each (task, generation, rank) it has held
names its log. The agent never deletes them: they stay readable, through the coordinator, until
the run folder is removed.

``unicron logs`` reaches them through the coordinator, which sends the agent a ``ReadLog``
order; the agent reads at most ``LOG_CHUNK_BYTES`` (in a thread: a read must not hold up the
heartbeats) and posts a ``LogChunk`` back (``control/service/logrelay.py``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import httpx

from unicron.control.agent.processes import Worker
from unicron.control.service.credentials import Credentials
from unicron.core.protocol import LOG_CHUNK_BYTES, LogChunk, ReadLog

ANSWER_TIMEOUT_S = 10.0  # to post one answer (at most ~700 KB) to the coordinator


def log_path(run_dir: Path, task: str, generation: int, rank: int) -> Path:
    """Where the worker launched as ``(task, generation, rank)`` writes its output."""
    return run_dir / "logs" / f"{task}-g{generation}-r{rank}.log"


def link_renamed(log: Path, run_dir: Path, task: str, generation: int, rank: int) -> None:
    """A worker writing to ``log`` is now ``(task, generation, rank)``: that name becomes a
    (relative) link to its file. Best effort: a folder that cannot take it loses only the name."""
    alias = log_path(run_dir, task, generation, rank)
    if alias == log:
        return
    fresh = alias.with_name(alias.name + ".link")
    with contextlib.suppress(OSError):
        fresh.unlink(missing_ok=True)
        fresh.symlink_to(log.name)  # the same folder
        os.replace(fresh, alias)


def located(order: ReadLog, run_dir: Path, workers: Iterable[Worker]) -> tuple[Path, bool]:
    """The log an order asks for, and whether a live worker still writes to it. A worker this
    agent still tracks is found under its present identity (its file keeps its first name);
    else the name, or the link a rename left, in the logs folder."""
    mine = {(w.order.task, w.order.generation, w.order.rank): w for w in workers}
    worker = mine.get((order.task, order.generation, order.rank))
    path = worker.log if worker is not None else log_path(run_dir, order.task, order.generation, order.rank)
    target = os.path.realpath(path)
    running = any(not w.exited and os.path.realpath(w.log) == target for w in mine.values())
    return path, running


@dataclass(frozen=True)
class Piece:
    """Bytes of a log from ``offset``; ``size``: the file's when read; ``capped``: the byte cap,
    not the request, decided where they start (lines before were wanted too)."""

    offset: int
    data: bytes
    size: int
    capped: bool


def read_log(
    path: Path, offset: int | None, tail: int | None, running: bool, cap: int = LOG_CHUNK_BYTES
) -> Piece:
    """From byte ``offset`` on (a follow: the first ``cap`` bytes), else (or with ``tail``, of
    what follows ``offset``) its last ``tail`` lines, all when None, within the last ``cap``
    bytes. A file shorter than ``offset`` was written anew: it is read from its start. A read
    that starts later than asked starts at a line; one of a log still written ends before a
    character cut short."""
    with path.open("rb") as out:
        size = os.fstat(out.fileno()).st_size
        begin = offset if offset is not None and offset <= size else 0
        start = begin if offset is not None and tail is None else max(begin, size - cap)
        out.seek(start)
        data = out.read(min(cap, size - start))
    capped = False
    if offset is None or tail is not None:
        start, data, capped = last_lines(start, data, tail, late=start > begin)
    if running:
        data = data[: complete_utf8(data)]
    return Piece(start, data, size, capped)


def last_lines(start: int, data: bytes, tail: int | None, late: bool) -> tuple[int, bytes, bool]:
    """The end of a log's ``data``, read from byte ``start`` to its end: its last ``tail`` lines
    (all when None), without the first line when the read began inside it (``late``: after the
    byte asked for). Returns where the kept bytes start, them, and whether lines wanted were
    left out because the read began late."""
    lines = data.splitlines(keepends=True)
    whole = lines[1:] if late and len(lines) > 1 else lines
    if tail is not None and len(whole) >= tail:
        whole, capped = whole[len(whole) - tail :] if tail else [], False
    else:
        capped = late
    kept = b"".join(whole)
    return start + len(data) - len(kept), kept, capped


def complete_utf8(data: bytes) -> int:
    """The length of ``data`` less a multi-byte UTF-8 character cut short at its end (its writer
    is still writing it: the next read starts with it)."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte < 0x80:
            return len(data)
        if byte >= 0xC0:  # the character's first byte says its length
            length = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return len(data) if back >= length else len(data) - back
    return len(data)


def chunk(order: ReadLog, node: str, path: Path, running: bool) -> LogChunk:
    """The answer to ``order``: the part of ``path`` it asks for, or why there is none."""
    where = os.path.abspath(path)
    try:
        piece = read_log(path, order.offset, order.tail, running)
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        error = (
            f"node {node} has no log {where} ({why}): the agent's run folder was removed or is "
            "another one (--run-dir), or the worker never started there"
        )
        return LogChunk(request=order.request, path=where, error=error[:1000])
    return LogChunk(
        request=order.request,
        path=where,
        offset=piece.offset,
        size=piece.size,
        running=running,
        capped=piece.capped,
        data=base64.b64encode(piece.data).decode(),
    )


async def answer(
    order: ReadLog, node: str, run_dir: Path, workers: Iterable[Worker], url: str, credentials: Credentials
) -> None:
    """Read what ``order`` asks for (in a thread) and post it to the coordinator at ``url``."""
    path, running = located(order, run_dir, workers)  # on the loop: the workers change there
    answered = await asyncio.to_thread(chunk, order, node, path, running)
    async with httpx.AsyncClient(
        timeout=ANSWER_TIMEOUT_S, headers=credentials.headers, verify=credentials.verify
    ) as client:
        response = await client.post(
            f"{url}/v1/agents/{node}/logs",
            content=answered.model_dump_json(),
            headers={"content-type": "application/json"},
        )
        response.raise_for_status()

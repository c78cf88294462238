"""Simulated agents for the scale benchmark: each registers its node and heartbeats at the real
interval over HTTP with the real protocol (``core.protocol``: Registration, Heartbeat), with no
workers. One process runs many on one event loop (``python -m bench.fleet``); the benchmark
starts a few such processes.

Each agent keeps one keep-alive connection (``Connection``: fixed request bytes, the answer read
by its length), starts at a random offset within the interval (as a cluster's agents do), and
re-registers when the coordinator says it does not know it; it also keeps the real agent's long
poll for orders open on a second connection. The
agent named ``--silent`` stops beating at ``--silent-at`` seconds: the coordinator must find it
lost within its deadline while every other node stays healthy. Writes, as JSON: every heartbeat's
(end time, latency in seconds), failures, and the silent agent's last answered beat (Unix time).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import uvloop

from unicron.control.service.tokens import issue
from unicron.control.store.secret import load_or_create_secret
from unicron.core.access import Role
from unicron.core.cadence import jittered
from unicron.core.protocol import Heartbeat, Registration

TIMEOUT_S = 5.0  # an answer slower than this counts as a failure (the connection is made anew)
POLL_WAIT_S = 2.0  # how long the coordinator holds each long poll for orders


class Connection:
    """One agent's keep-alive HTTP/1.1 connection, kept as lean as the protocol allows: the
    requests are fixed bytes and an answer is read by its Content-Length (uvicorn sends one).
    An HTTP client library costs about a millisecond of CPU a request; at 2,048 agents on this
    2-core machine that alone would take both cores from the coordinator being measured."""

    def __init__(self, url: str) -> None:
        where = urlsplit(url)
        self.host, self.port = where.hostname or "127.0.0.1", where.port or 80
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, request: bytes) -> tuple[int, bytes]:
        try:
            if self.writer is None or self.reader is None:
                opening = asyncio.open_connection(self.host, self.port)
                self.reader, self.writer = await asyncio.wait_for(opening, TIMEOUT_S)
            self.writer.write(request)
            head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), TIMEOUT_S)
            status = int(head.split(b" ", 2)[1])
            length = next(
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            return status, await asyncio.wait_for(self.reader.readexactly(length), TIMEOUT_S)
        except (OSError, asyncio.IncompleteReadError, ValueError, StopIteration, TimeoutError):
            if self.writer is not None:
                self.writer.close()
            self.reader = self.writer = None
            raise ConnectionError("the coordinator closed the connection") from None


def request(url: str, path: str, token: str, body: str) -> bytes:
    where = urlsplit(url)
    payload = body.encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {where.netloc}\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    )
    return head.encode() + payload


async def agent(
    url: str, name: str, token: str, until: float, silent_at: float | None, out: dict[str, Any]
) -> None:
    register = request(url, "/v1/agents/register", token, Registration(node=name, slots=8).model_dump_json())

    answered_at = time.monotonic()

    def beat() -> bytes:  # the real agent's heartbeat: when it is sent, since the last answer
        waited = time.monotonic() - answered_at
        body = Heartbeat(node=name, acked=0, sent=time.time(), waited_s=waited).model_dump_json()
        return request(url, "/v1/agents/heartbeat", token, body)

    connection = Connection(url)
    interval = 0.5
    poller = asyncio.create_task(poll_orders(url, name, token, until, silent_at))
    await asyncio.sleep(random.uniform(0, interval))
    registered = False
    next_at = time.monotonic()
    while time.time() < until:
        if silent_at is not None and time.time() >= silent_at:
            return  # this node goes silent: the coordinator must find it lost
        began = time.monotonic()
        try:
            if not registered:
                status, body = await connection.post(register)
                if status != 200:
                    raise ConnectionError(f"registration answered {status}")
                interval = float(json.loads(body)["heartbeat_interval_s"])
                registered = True
            status, body = await connection.post(beat())
            if status != 200:
                raise ConnectionError(f"heartbeat answered {status}")
            answered_at = time.monotonic()
            out["latency"].append([time.time(), time.monotonic() - began])
            answer = json.loads(body)
            registered = answer.get("registered", True)
            interval = float(answer.get("heartbeat_interval_s") or interval)  # (core/cadence.py)
            if silent_at is not None:
                out["silent_last_beat"] = time.time()
        except ConnectionError:
            out["failures"] += 1
        next_at += jittered(interval)
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))
    poller.cancel()


async def poll_orders(url: str, name: str, token: str, until: float, silent_at: float | None) -> None:
    """The agent's long poll for orders, on a connection of its own, as the real agent keeps it
    (``control/agent/agent.py``: ``wait`` four heartbeat intervals); no orders come to these nodes."""
    where = urlsplit(url)
    head = f"GET /v1/agents/{name}/orders?wait={POLL_WAIT_S}&acked=0 HTTP/1.1\r\nHost: {where.netloc}\r\n"
    poll = (head + f"Authorization: Bearer {token}\r\n\r\n").encode()
    connection = Connection(url)
    await asyncio.sleep(random.uniform(0, 2.0))  # agents start at different times
    while time.time() < until and (silent_at is None or time.time() < silent_at):
        try:
            await connection.post(poll)
        except ConnectionError:
            await asyncio.sleep(0.5)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    secret = load_or_create_secret(Path(args.state_dir))
    out: dict[str, Any] = {"latency": [], "failures": 0, "silent_last_beat": None}
    names = [f"{args.prefix}{i:05d}" for i in range(args.count)]
    await asyncio.gather(
        *(
            agent(
                args.url,
                name,
                issue(secret, Role.AGENT, name),
                args.until,
                args.silent_at if name == args.silent else None,
                out,
            )
            for name in names
        )
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--state-dir", required=True)  # the coordinator's (its secret)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--until", type=float, required=True)  # Unix time to stop
    parser.add_argument("--silent", default="")
    parser.add_argument("--silent-at", type=float, default=0.0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    # uvloop, as the coordinator runs on: the agents' own CPU is taken from the coordinator's.
    began_cpu, began = time.process_time(), time.monotonic()
    out = uvloop.run(run(args))
    out["cores"] = (time.process_time() - began_cpu) / (time.monotonic() - began)  # its own CPU
    Path(args.out).write_text(json.dumps(out))


if __name__ == "__main__":
    main()

"""The agents' lean path: registrations, heartbeats and long polls answered before FastAPI.

A cluster of 2,048 agents sends about 4,000 heartbeats a second, on the loop that also judges
liveness. Through FastAPI each cost about a millisecond of CPU (routing, solving the route's
dependencies, the body-limit middleware wrapping every message); the coordinator's own work is a
small part of it; each agent's long poll for orders adds one more request every two seconds, and
all of them register at once when a coordinator starts or takes over. This ASGI layer takes those
three routes' requests itself: check the bearer token (``Guard``, its claims cached), read the
body (at most ``MAX_BODY_BYTES``) or the query, parse it, check its lists and mappings against
their bounds (``AGENT_BOUNDS``: a body under the limit could list thousands of workers or
reports, each then validated and handled on this loop), validate it with pydantic, ask the
coordinator, write the answer. Every other request goes on to the app unchanged. The routes are
still declared to FastAPI (``service.py``) so that the OpenAPI schema describes them, and the
answers here (200, 401, 403, 413, 422, each JSON error naming the fix) have the shapes that schema
declares; the schema fuzzer tests them.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Callable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Protocol, TypeVar
from urllib.parse import parse_qsl

from pydantic import BaseModel, Field, ValidationError
from pydantic_core import from_json
from starlette.types import ASGIApp, Receive, Scope, Send

from unicron.control.service.guard import Guard, enforce, own_node
from unicron.core.access import Need, Principal
from unicron.core.errors import UnicronError
from unicron.core.limits import MAX_BODY_BYTES, MAX_INT
from unicron.core.protocol import AGENT_BOUNDS, Heartbeat, IterationReport, OrderBatch, Registration

if TYPE_CHECKING:
    from unicron.control.coordinator import Coordinator

BEAT, REGISTER = "/v1/agents/heartbeat", "/v1/agents/register"
ORDERS = ("/v1/agents/", "/orders")  # GET /v1/agents/{node}/orders: the long poll
Message = TypeVar("Message", bound=BaseModel)
FIX = "send a request matching the OpenAPI schema at /openapi.json"


class Refused(Exception):
    """A request refused before the coordinator saw it (413, 422): its status and body."""

    def __init__(self, status: int, body: dict[str, Any]):
        super().__init__(status)
        self.status, self.body = status, body


def _bearer(scope: Scope) -> str | None:
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            return token.strip() if scheme.lower() == "bearer" and token.strip() else None
    return None


class Agents(Protocol):
    """What the channel answers with (the service's runtime: the coordinator is made when the
    service starts)."""

    @property
    def c(self) -> Coordinator: ...

    async def poll_orders(self, node: str, acked: int, wait: float) -> OrderBatch: ...

    async def durable(self) -> None: ...


class OrdersQuery(BaseModel):
    """The long poll's query, with the bounds the route declares."""

    wait: float = Field(2.0, ge=0, le=30)
    acked: int = Field(0, ge=0, le=MAX_INT)


class AgentChannel:
    """Serves the agents' registrations, heartbeats and long polls from ``agents``, checking tokens with
    ``guard`` and each error's status with ``status_of``; hands everything else to ``app``."""

    def __init__(
        self, app: ASGIApp, guard: Guard, agents: Agents, status_of: Callable[[UnicronError], int]
    ) -> None:
        self.app, self.guard, self.agents, self.status_of = app, guard, agents, status_of

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        poll = _polled_node(scope)
        posted = scope["path"] if scope["type"] == "http" and scope["method"] == "POST" else None
        if poll is None and posted not in (BEAT, REGISTER):
            await self.app(scope, receive, send)
            return
        try:
            principal = self._caller(scope)
            answer: BaseModel
            if poll is not None:
                answer = await self._orders(scope, principal, poll)
            elif posted == BEAT:
                beat = await _message(receive, Heartbeat)
                own_node(principal, beat.node)
                answer = self.agents.c.heartbeat(beat)
                # An answer leaves once what it follows from is durable: its orders, and the
                # reports it answers, which the agent then drops (a leader killed between
                # answering and writing lost an exit, an error, a fault's record). Not a step's
                # report: the next one says as much (a count that only grows), and nearly every
                # beat of a training node carries one.
                if answer.orders or any(not isinstance(r, IterationReport) for r in beat.reports):
                    await self.agents.durable()
            else:
                registration = await _message(receive, Registration)
                own_node(principal, registration.node)
                answer = self.agents.c.register(registration)
            await _send(send, 200, answer.model_dump_json().encode())
        except UnicronError as exc:
            status = self.status_of(exc)
            headers = [(b"www-authenticate", b"Bearer")] if status == 401 else None
            await _send(send, status, json.dumps({"error": str(exc)}).encode(), headers)
        except Refused as no:
            await _send(send, no.status, json.dumps(no.body).encode())

    def _caller(self, scope: Scope) -> Principal:
        principal = self.guard.token(token) if (token := _bearer(scope)) else None
        # No valid token: 401; a token of another role: 403 (its node is checked by the caller).
        enforce(principal, Need.OWN_NODE, principal.subject if principal else None)
        assert principal is not None
        return principal

    async def _orders(self, scope: Scope, principal: Principal, node: str) -> OrderBatch:
        own_node(principal, node)
        # The last of a repeated parameter counts, as in Starlette's QueryParams.
        given = dict(parse_qsl(scope["query_string"].decode("latin-1"), keep_blank_values=True))
        try:
            query = OrdersQuery.model_validate({k: v for k, v in given.items() if k in ("wait", "acked")})
        except ValidationError as exc:
            raise Refused(422, {"error": "invalid request", "problems": _problems(exc, "query")}) from None
        return await self.agents.poll_orders(node, query.acked, query.wait)


def _polled_node(scope: Scope) -> str | None:
    """The node of a ``GET /v1/agents/{node}/orders``, else None."""
    if scope["type"] != "http" or scope["method"] != "GET":
        return None
    path: str = scope["path"]
    if not (path.startswith(ORDERS[0]) and path.endswith(ORDERS[1])):
        return None
    node = path[len(ORDERS[0]) : -len(ORDERS[1])]
    return node if node and "/" not in node else None


async def _message(receive: Receive, model: type[Message]) -> Message:
    """``model`` from the request's body: parsed, its lists and mappings within AGENT_BOUNDS
    (checked before any entry is validated), then validated; a body that is not JSON is refused
    by the model's own parser, whose error says where it breaks."""
    body = await _body(receive)
    try:
        try:
            data = parse_json(body)
        except ValueError:
            return model.model_validate_json(body)
        excess = AGENT_BOUNDS.first_excess(data, "body")
        if excess is not None:
            raise Refused(422, {"error": excess.render(), "problems": [asdict(excess)]})
        return model.model_validate(data)
    except ValidationError as exc:
        raise Refused(422, {"error": "invalid request", "problems": _problems(exc, "body")}) from None


def parse_json(body: bytes) -> Any:
    """JSON parsed with the garbage collector paused: a parse makes no reference cycles, and the
    collections its allocations set off scan the document being built again and again (a
    heartbeat of a megabyte of nested lists: 157 ms to refuse with them, 83 ms without)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return from_json(body)
    finally:
        if enabled:
            gc.enable()


async def _body(receive: Receive) -> bytes:
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise Refused(400, {"error": "the client went away before sending the whole body"})
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            error = f"request body larger than {MAX_BODY_BYTES} bytes: send a smaller heartbeat"
            raise Refused(413, {"error": error})
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _problems(exc: ValidationError, where: str) -> list[dict[str, str]]:
    return [
        {"path": ".".join([where, *(str(x) for x in e["loc"])]), "message": e["msg"], "fix": FIX}
        for e in exc.errors()
    ]


Headers = list[tuple[bytes, bytes]]


async def _send(send: Send, status: int, body: bytes, headers: Headers | None = None) -> None:
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": head + (headers or [])})
    await send({"type": "http.response.body", "body": body})

"""The coordinator's HTTP service: a REST API for users and a channel for agents.

Users: submit a task (its YAML or JSON spec as the body), list, read and cancel tasks, list nodes
and workers, read events. Agents: register and heartbeat (reports up, orders down). The OpenAPI
spec is served at /openapi.json. Every error is JSON naming the problem and the fix.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from functools import partial
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import Scope

from unicron.brain.records import TaskRecord
from unicron.control.coordinator import Coordinator, CoordinatorSettings
from unicron.control.observe.breakdown import KINDS, Breakdown, breakdowns
from unicron.control.observe.metrics import CONTENT_TYPE
from unicron.control.service import dashboard, logrelay
from unicron.control.service.agentchannel import AgentChannel
from unicron.control.service.bodylimit import BodyLimit
from unicron.control.service.guard import Guard, own_node
from unicron.control.service.revocation import Revocations
from unicron.control.store.backend import Fenced
from unicron.control.store.gcpolicy import GcPolicy
from unicron.control.store.leadership import abdicate, lead
from unicron.control.store.location import open_backend
from unicron.control.store.secret import load_or_create_secret
from unicron.core.access import Need, Principal
from unicron.core.errors import (
    Conflict,
    Forbidden,
    NotFound,
    SpecError,
    Unauthenticated,
    Unavailable,
    UnicronError,
)
from unicron.core.limits import MAX_INT
from unicron.core.livespecs import LiveTaskSpec, parse_live_tasks
from unicron.core.protocol import Heartbeat, HeartbeatReply, OrderBatch, Registration, RegistrationReply

TICK_S = 0.1


def task_summary(coordinator: Coordinator, row: TaskRecord) -> dict[str, Any]:
    spec, now = coordinator.spec(row.name), coordinator.clock()
    end = row.finished or now
    elapsed = end - row.started if row.started else 0.0
    return {
        "name": row.name,
        "state": row.state.value,
        "reason": row.reason,
        "weight": spec.weight,
        "workers": row.workers,
        "generation": row.generation,
        "step": row.step,
        "iterations": spec.run.iterations,
        "checkpoint_step": row.checkpoint_step,
        "failures": row.failures,
        "restarts": row.restarts,
        "downtime_s": row.downtime(now),
        "samples": row.samples,
        "weighted_flop": row.flop,
        "waf": row.flop / elapsed if elapsed > 0 else 0.0,
        "digest": row.digest,
        "submitted": row.submitted,
        "started": row.started,
        "finished": row.finished,
        "run": row.run,  # the how-many-th task of its name (an ended one is kept as NAME#RUN)
    }


class Runtime:
    """What the routes share: the coordinator (made when the service starts, ticked on its event
    loop) and the long polls' wake-ups."""

    def __init__(self, settings: CoordinatorSettings) -> None:
        self.settings = settings
        self.coordinator: Coordinator | None = None
        self.waiters: dict[str, asyncio.Future[None]] = {}  # each node's open long poll

    @property
    def c(self) -> Coordinator:
        if self.coordinator is None:
            raise RuntimeError("the coordinator is made when the service starts (lifespan)")
        return self.coordinator

    def wake(self, node: str) -> None:
        waiter = self.waiters.pop(node, None)
        if waiter is not None:
            _release(waiter)

    async def durable(self) -> None:
        """Return once every change made so far is durable in the store (``journal.py``): before
        an answer that tells of them leaves (a task queued, an order), without blocking the loop."""
        journal = self.c.journal
        if journal is None or journal.durable >= journal.queued:
            return
        loop = asyncio.get_running_loop()
        written: asyncio.Future[None] = loop.create_future()
        journal.when_durable(lambda: loop.call_soon_threadsafe(_release, written))
        await written

    async def poll_orders(self, node: str, acked: int, wait: float) -> OrderBatch:
        """Long poll: answers once there are orders for the node not acknowledged yet
        (``acked``: the last one carried out), or after ``wait`` seconds. A future and a timer
        rather than ``wait_for``: thousands of agents each keep one poll open."""
        found = self.c.orders(node, acked)
        if found.orders:
            await self.durable()
        if found.orders or wait <= 0:
            return found
        loop = asyncio.get_running_loop()
        waiter = self.waiters[node] = loop.create_future()
        timer = loop.call_later(wait, _release, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            if self.waiters.get(node) is waiter:
                del self.waiters[node]
        found = self.c.orders(node, acked)
        if found.orders:
            await self.durable()
        return found

    @contextlib.asynccontextmanager
    async def lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        # With etcd, a standby waits here, its port closed (agents and clients go to the next
        # address they were given), until it leads; then it loads the state and serves.
        backend = open_backend(self.settings.store_location)
        leading = await asyncio.to_thread(lead, backend, self.settings.url, self.settings.limits.leader_ttl_s)
        coordinator = self.coordinator = Coordinator(
            self.settings, backend=backend, write_behind=lambda exc: abdicate(str(exc))
        )
        coordinator.orders_out.on_add = self.wake

        collector = GcPolicy()

        async def loop() -> None:
            planned = time.monotonic()
            while True:
                try:
                    # How late the loop came here: it was busy (heartbeats queued meanwhile)
                    late_s, planned = max(0.0, time.monotonic() - planned), time.monotonic() + TICK_S
                    collector.step(time.monotonic())
                    coordinator.tick(late_s)
                except Fenced as exc:
                    abdicate(str(exc))
                except Exception as exc:  # keep serving; the failure is recorded
                    coordinator.act.record("coordinator_error", error=repr(exc)[:500])
                await asyncio.sleep(TICK_S)

        ticker = asyncio.create_task(loop())
        try:
            yield
        finally:
            ticker.cancel()
            coordinator.shutdown()
            if leading is not None:
                leading.resign()


def _release(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def create_app(settings: CoordinatorSettings) -> AgentChannel:
    runtime = Runtime(settings)
    guard = Guard(
        load_or_create_secret(settings.state_dir),
        Revocations(settings.state_dir),
        also_revoked=lambda: runtime.coordinator.revoked if runtime.coordinator else frozenset(),
    )
    # The schema is served below, behind a token like every other call; no interactive docs.
    app = FastAPI(
        title="Unicron coordinator",
        version="0.1.0",
        lifespan=runtime.lifespan,
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
    )
    app.add_middleware(BodyLimit)
    _error_handlers(app)
    read, manage = Depends(guard.needing(Need.READ)), Depends(guard.needing(Need.MANAGE))
    app.include_router(_task_routes(runtime), dependencies=[read], responses=ERRORS)
    app.include_router(_manage_routes(runtime), dependencies=[manage], responses=ERRORS)
    app.include_router(_cluster_routes(runtime), dependencies=[read], responses=ERRORS)
    app.include_router(_watch_routes(runtime), dependencies=[read], responses=ERRORS)
    app.include_router(_agent_routes(runtime, guard), responses=ERRORS)
    # Workers' logs, read by their agents (control/service/logrelay.py): a reader's role reads them.
    relay = logrelay.LogRelay(lambda: runtime.c)
    app.include_router(logrelay.user_routes(relay), dependencies=[read], responses=ERRORS | UNAVAILABLE)
    app.include_router(logrelay.agent_routes(relay, guard), responses=ERRORS)
    app.include_router(_page_routes())

    @app.get("/openapi.json", dependencies=[read], include_in_schema=False)
    async def schema() -> dict[str, Any]:
        return app.openapi()

    # Outermost: the agents' heartbeats and long polls are answered there, before FastAPI.
    return AgentChannel(app, guard, runtime, status_of)


def status_of(exc: UnicronError) -> int:
    """The HTTP status of an error a route raises (the most specific class wins)."""
    return next(code for kind, code in STATUS.items() if isinstance(exc, kind))


class RevokeRequest(BaseModel):
    jti: str = Field(pattern="^[0-9a-f]{32}$", description="the token's id, as `token create` printed it")
    role: str | None = Field(None, max_length=20)
    sub: str | None = Field(None, max_length=63)


class DrainRequest(BaseModel):
    reason: str = Field("", max_length=200, description="why (recorded with the event)")


class LossHoldRequest(BaseModel):
    held: bool = Field(description="true: hold every node loss; false: release the hold")
    reason: str = Field("", max_length=200, description="why (recorded with the event)")


class Problem(BaseModel):
    path: str
    message: str
    fix: str


class ErrorBody(BaseModel):
    """Every error's body: what is wrong (and, for a bad spec or request, each problem's fix)."""

    error: str
    problems: list[Problem] | None = None


# Declared on every route, so that clients (and the fuzzer) know each answer's shape.
ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody, "description": why}
    for code, why in {
        400: "a malformed request",
        401: "no valid bearer token",
        403: "the token's role or node may not do this",
        404: "no such task",
        409: "conflicts with the current state",
        413: "request body too large",
        422: "invalid spec or request, each problem with its fix",
    }.items()
}

# The HTTP status of each kind of error a route raises (the most specific class wins).
STATUS = {
    Unauthenticated: 401,
    Forbidden: 403,
    NotFound: 404,
    Conflict: 409,
    Unavailable: 503,
    UnicronError: 400,
}
UNAVAILABLE: dict[int | str, dict[str, Any]] = {
    503: {"model": ErrorBody, "description": "the node that holds it is lost, or its agent did not answer"}
}


def _error_handlers(app: FastAPI) -> None:
    """Every error as JSON naming the problem (and the fix); the status from the error's type."""

    @app.exception_handler(SpecError)
    async def spec_error(_: Request, exc: SpecError) -> JSONResponse:
        return JSONResponse(
            status_code=422,
            content={
                "error": str(exc),
                "problems": [{"path": p.path, "message": p.message, "fix": p.fix} for p in exc.problems],
            },
        )

    @app.exception_handler(UnicronError)
    async def usage_error(_: Request, exc: UnicronError) -> JSONResponse:
        status = status_of(exc)
        headers = {"www-authenticate": "Bearer"} if status == 401 else None
        return JSONResponse(status_code=status, content={"error": str(exc)}, headers=headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # Starlette's and FastAPI's own refusals (an unreadable body, no such route, a method
        # the route does not take), in the one shape every error has.
        headers = {k.lower(): v for k, v in (exc.headers or {}).items()}
        if exc.status_code == 405:
            headers["allow"] = ", ".join(allowed_methods(app, request.scope))
        error = _said(exc.status_code, request, headers.get("allow", ""), str(exc.detail))
        return JSONResponse(status_code=exc.status_code, content={"error": error}, headers=headers)

    @app.exception_handler(Exception)
    async def failed(_: Request, exc: Exception) -> JSONResponse:
        # A bug, not the request's fault: said in the same shape (the traceback goes to the log).
        error = f"the coordinator failed on this request ({type(exc).__name__}): its log has the details"
        return JSONResponse(status_code=500, content={"error": error})

    @app.exception_handler(RequestValidationError)
    async def bad_body(_: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [
            {
                "path": ".".join(str(x) for x in e["loc"]),
                "message": e["msg"],
                "fix": "send a request matching the OpenAPI schema at /openapi.json",
            }
            for e in exc.errors()
        ]
        return JSONResponse(status_code=422, content={"error": "invalid request", "problems": problems})


METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def allowed_methods(app: FastAPI, scope: Scope) -> list[str]:
    """Every method some route of ``scope``'s path takes, each asked of the routes as a request
    of it would be (Starlette's 405 names only the first route's: ``GET`` for ``/v1/tasks``,
    whose ``POST`` is another route)."""
    return sorted(
        method
        for method in METHODS
        if any(route.matches({**scope, "method": method})[0] is Match.FULL for route in app.router.routes)
    )


def _said(status: int, request: Request, allow: str, detail: str) -> str:
    fix = "see the OpenAPI schema at /openapi.json"
    if status == 400:
        return f"the request body could not be read as JSON (UTF-8): send a JSON object as {fix} describes"
    if status == 404:
        return f"no route {request.method} {request.url.path}: {fix}"
    if status == 405:
        return f"{request.method} is not a method of {request.url.path}: use {allow or 'none'}"
    return detail


_SPEC_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/yaml": {"schema": {"type": "string"}},
            "application/json": {"schema": {"type": "object"}},
        },
    }
}


def _manage_routes(runtime: Runtime) -> APIRouter:
    """What runs programs on the nodes or stops them: admin tokens only."""
    router = APIRouter()

    @router.post("/v1/tasks", status_code=201, openapi_extra=_SPEC_BODY)
    async def submit(request: Request) -> list[dict[str, Any]]:
        """Submit one task (a mapping with `name`) or several (under `tasks:`), as YAML or JSON."""
        body = await request.body()
        # Parsed and validated in a thread: the loop answers heartbeats meanwhile. The parse
        # itself refuses a body past core.limits' counts before building any model.
        specs = await asyncio.to_thread(parse_submission, body)
        runtime.c.submit(*specs)
        await runtime.durable()
        return [task_summary(runtime.c, runtime.c.store.get_task(s.name)) for s in specs]

    @router.delete("/v1/tasks/{name}")
    async def cancel(name: str) -> dict[str, Any]:
        """Cancel a task; one that has ended already is left as it is (`cancelled`: false)."""
        cancelled = runtime.c.cancel(name)
        await runtime.durable()
        return {**task_summary(runtime.c, runtime.c.store.get_task(name)), "cancelled": cancelled}

    @router.delete("/v1/nodes/{name}")
    async def remove_node(name: str) -> dict[str, str]:
        """Forget a lost node holding no workers (a retired machine, a stale registration)."""
        runtime.c.remove_node(name)
        await runtime.durable()
        return {"removed": name}

    @router.post("/v1/tokens/revoked")
    async def revoke_token(body: RevokeRequest) -> dict[str, str]:
        """Refuse a token from now on, at this coordinator and every one that leads after it
        (kept in the store)."""
        runtime.c.revoke_token(body.model_dump(exclude_none=True))
        await runtime.durable()
        return {"revoked": body.jti}

    @router.post("/v1/nodes/{name}/drain")
    async def drain_node(name: str, body: DrainRequest | None = None) -> dict[str, str]:
        """Take a node out of service: its tasks move off without losing a step, nothing new is
        placed there, until it is resumed."""
        runtime.c.drain_node(name, body.reason if body is not None else "")
        await runtime.durable()
        return {"draining": name}

    @router.post("/v1/node-losses")
    async def hold_node_losses(body: LossHoldRequest) -> dict[str, bool]:
        """Hold every node loss (no silent node is declared lost: say, through a planned change
        of the network) or release the hold. It outlives a restart of the coordinator."""
        runtime.c.hold_node_losses(body.held, body.reason)
        await runtime.durable()
        return {"held": body.held}

    @router.post("/v1/nodes/{name}/resume")
    async def resume_node(name: str) -> dict[str, str]:
        """Put a drained or isolated node back in service."""
        runtime.c.resume_node(name)
        await runtime.durable()
        return {"resumed": name}

    return router


def parse_submission(body: bytes) -> list[LiveTaskSpec]:
    return parse_live_tasks(body.decode("utf-8", errors="replace"), "request body")


def _task_routes(runtime: Runtime) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/tasks")
    async def tasks() -> list[dict[str, Any]]:
        return [task_summary(runtime.c, t) for t in runtime.c.store.tasks()]

    @router.get("/v1/tasks/{name}")
    async def task(name: str) -> dict[str, Any]:
        return task_summary(runtime.c, runtime.c.store.get_task(name))

    return router


def _cluster_routes(runtime: Runtime) -> APIRouter:
    router = APIRouter()

    @router.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @router.get("/v1/node-losses")
    async def node_losses() -> dict[str, Any]:
        """Whether an admin holds node losses, why and since when; and what holds them back
        now (``now``: the hold, an alarm, failure domains partly silent, how many nodes)."""
        now = runtime.c.nodes.holding()
        held = {"by_hand": now.by_hand, "alarm": now.alarm, "domains": list(now.domains), "nodes": now.nodes}
        return {**runtime.c.node_losses().model_dump(exclude={"NAME"}), "now": held}

    @router.get("/v1/nodes")
    async def nodes() -> list[dict[str, Any]]:
        held = runtime.c.store.held_slots()
        return [
            {
                "name": n.name,
                "id": n.id,
                "slots": n.slots,
                "gpus": n.gpus,
                "host": n.host,
                "state": n.state.value,
                "seconds_since_heartbeat": round(time.time() - n.last_seen, 3),
                "used": held.get(n.name, {}),
                "domain": n.domain,
            }
            for n in runtime.c.store.nodes()
        ]

    @router.get("/v1/workers")
    async def workers() -> list[dict[str, Any]]:
        store = runtime.c.store
        return [w.as_dict() for t in store.tasks(live_only=True) for w in store.workers(t.name, t.generation)]

    @router.get("/v1/events")
    async def events(
        since: Annotated[int, Query(ge=0, le=MAX_INT, description="events after this id")] = 0,
        task: Annotated[str | None, Query(max_length=63)] = None,
        limit: Annotated[int, Query(ge=1, le=1_000_000)] = 1000,
    ) -> list[dict[str, Any]]:
        # Read in a thread (the store's reads are locked): a reader of a long log, or of etcd, must
        # not hold up the loop that reads heartbeats and judges liveness.
        found = await asyncio.to_thread(runtime.c.store.events, since, task, limit)
        return [e.as_dict() for e in found]

    return router


def _watch_routes(runtime: Runtime) -> APIRouter:
    """What watching the cluster reads: incidents' breakdowns, the dashboard's state, metrics."""
    router = APIRouter()

    @router.get("/v1/incidents")
    async def incidents(
        task: Annotated[str | None, Query(max_length=63)] = None,
        last: Annotated[int, Query(ge=1, le=10_000, description="the newest this many")] = 100,
    ) -> list[dict[str, Any]]:
        """Each incident's breakdown: fault, detection, decision, transition and first step after
        it, with the work it cost and the ladder's actions (``control/observe/breakdown.py``). Read in a
        thread: the event log may be long (and in etcd), and the loop judges liveness."""
        found = await asyncio.to_thread(recent_incidents, runtime.c, task, last)
        return [b.as_dict() for b in found]

    @router.get("/v1/dashboard", response_model=dict[str, Any])
    async def dashboard_state(
        since: Annotated[float, Query(ge=0, description="WAF points after this time (Unix)")] = 0.0,
    ) -> Response:
        """Everything the dashboard page shows, in one reading."""
        c = runtime.c
        view, history = c.viewer.view(), c.history.since(since)  # read on the loop, consistent
        # The event log's reads and the document's making in a thread (the log waits for the
        # journal and may be in etcd; at thousands of nodes the document is large).
        plans = await asyncio.to_thread(c.store.events, kinds=("plan",), limit=20, newest=True)
        incidents = await asyncio.to_thread(recent_incidents, c, None, 30)
        document = partial(dashboard.document, view, history, incidents, plans)
        body = await asyncio.to_thread(lambda: json.dumps(document(), allow_nan=False).encode())
        return Response(body, media_type="application/json")

    @router.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        """Prometheus metrics (``control/observe/metrics.py``); scrape with a viewer token. The cluster is
        read on the loop (a consistent reading), formatted in a thread."""
        view = runtime.c.viewer.view()
        return Response(await asyncio.to_thread(runtime.c.metrics.exposition, view), media_type=CONTENT_TYPE)

    return router


def recent_incidents(c: Coordinator, task: str | None, last: int) -> list[Breakdown]:
    """The newest ``last`` incidents' breakdowns (of ``task``), from the events that tell them."""
    events = c.store.events(task=task, kinds=KINDS, limit=50 * last, newest=True)
    return breakdowns(events)[-last:]


def _page_routes() -> APIRouter:
    """The dashboard's page and files: no data in them (the page asks the API for it, with the
    token it is given), so they need no token."""
    router = APIRouter()

    @router.get("/", include_in_schema=False)
    async def page() -> Response:
        return Response(dashboard.asset("index.html"), media_type=dashboard.ASSETS["index.html"])

    @router.get("/ui/{name}", include_in_schema=False)
    async def ui_file(name: str) -> Response:
        if name not in dashboard.ASSETS or name == "index.html":
            raise NotFound(f"no file {name!r} in the dashboard")
        return Response(dashboard.asset(name), media_type=dashboard.ASSETS[name])

    return router


def _agent_routes(runtime: Runtime, guard: Guard) -> APIRouter:
    """The agent channel: agent tokens only, each for the node it was issued for."""
    router = APIRouter()
    Agent = Depends(guard.agent)

    @router.post("/v1/agents/register")
    async def register(reg: Registration, caller: Principal = Agent) -> RegistrationReply:
        """Answered by ``AgentChannel``, as the heartbeat is."""
        own_node(caller, reg.node)
        return runtime.c.register(reg)

    @router.post("/v1/agents/heartbeat")
    async def heartbeat(hb: Heartbeat, caller: Principal = Agent) -> HeartbeatReply:
        """Answered by ``AgentChannel`` (control/service/agentchannel.py) before routing reaches here;
        declared for the schema, and the same answer if the channel is ever not in front."""
        own_node(caller, hb.node)
        return runtime.c.heartbeat(hb)

    @router.get("/v1/agents/{node}/orders")
    async def orders(
        node: str,
        wait: Annotated[float, Query(ge=0, le=30, description="seconds to wait for an order")] = 2.0,
        acked: Annotated[int, Query(ge=0, le=MAX_INT)] = 0,
        caller: Principal = Agent,
    ) -> OrderBatch:
        """Long poll: answers once there are orders for the node not acknowledged yet
        (``acked``: the last one carried out), or after ``wait`` seconds. Answered by
        ``AgentChannel``, as the heartbeat is."""
        own_node(caller, node)
        return await runtime.poll_orders(node, acked, wait)

    return router

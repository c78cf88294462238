"""The coordinator's HTTP service: a REST API for users and a channel for agents.

Users: submit a task (its YAML or JSON spec as the body), list, read and cancel tasks, list nodes
and workers, read events. Agents: register and heartbeat (reports up, orders down). The OpenAPI
spec is served at /openapi.json. Every error is JSON naming the problem and the fix.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from unicron.control.coordinator import Coordinator, CoordinatorSettings
from unicron.control.records import TaskRecord
from unicron.core.errors import Conflict, NotFound, SpecError, UnicronError
from unicron.core.livespecs import parse_live_tasks
from unicron.core.protocol import Heartbeat, HeartbeatReply, OrderBatch, Registration, RegistrationReply

TICK_S = 0.1


def task_summary(coordinator: Coordinator, row: TaskRecord) -> dict[str, Any]:
    spec = coordinator.spec(row.name)
    end = row.finished or time.time()
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
        "downtime_s": row.downtime_s + ((time.time() - row.down_since) if row.down_since else 0.0),
        "samples": row.samples,
        "weighted_flop": row.flop,
        "waf": row.flop / elapsed if elapsed > 0 else 0.0,
        "digest": row.digest,
        "submitted": row.submitted,
        "started": row.started,
        "finished": row.finished,
    }


def create_app(settings: CoordinatorSettings) -> FastAPI:
    holder: dict[str, Coordinator] = {}
    wakeups: dict[str, asyncio.Event] = {}

    def wake(node: str) -> None:
        event = wakeups.get(node)
        if event is not None:
            event.set()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        coordinator = Coordinator(settings)
        coordinator.orders_out.on_add = wake
        holder["c"] = coordinator

        async def loop() -> None:
            while True:
                try:
                    coordinator.tick()
                except Exception as exc:  # keep serving; the failure is recorded
                    coordinator.store.event("coordinator_error", error=repr(exc)[:500])
                await asyncio.sleep(TICK_S)

        ticker = asyncio.create_task(loop())
        try:
            yield
        finally:
            ticker.cancel()
            coordinator.shutdown()

    app = FastAPI(title="Unicron coordinator", version="0.1.0", lifespan=lifespan)

    def c() -> Coordinator:
        return holder["c"]

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
        status = 404 if isinstance(exc, NotFound) else 409 if isinstance(exc, Conflict) else 400
        return JSONResponse(status_code=status, content={"error": str(exc)})

    @app.exception_handler(RequestValidationError)
    async def bad_body(_: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [
            {
                "path": ".".join(str(x) for x in e["loc"]),
                "message": e["msg"],
                "fix": "send a body matching the OpenAPI schema at /openapi.json",
            }
            for e in exc.errors()
        ]
        return JSONResponse(status_code=422, content={"error": "invalid request body", "problems": problems})

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post(
        "/v1/tasks",
        status_code=201,
        openapi_extra={
            "requestBody": {
                "required": True,
                "content": {
                    "application/yaml": {"schema": {"type": "string"}},
                    "application/json": {"schema": {"type": "object"}},
                },
            }
        },
    )
    async def submit(request: Request) -> list[dict[str, Any]]:
        """Submit one task (a mapping with `name`) or several (under `tasks:`), as YAML or JSON."""
        body = (await request.body()).decode("utf-8", errors="replace")
        specs = parse_live_tasks(body, "request body")
        c().submit(*specs)
        return [task_summary(c(), c().store.get_task(s.name)) for s in specs]

    @app.get("/v1/tasks")
    async def tasks() -> list[dict[str, Any]]:
        return [task_summary(c(), t) for t in c().store.tasks()]

    @app.get("/v1/tasks/{name}")
    async def task(name: str) -> dict[str, Any]:
        return task_summary(c(), c().store.get_task(name))

    @app.delete("/v1/tasks/{name}")
    async def cancel(name: str) -> dict[str, Any]:
        c().cancel(name)
        return task_summary(c(), c().store.get_task(name))

    @app.get("/v1/nodes")
    async def nodes() -> list[dict[str, Any]]:
        held = c().store.held_slots()
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
            }
            for n in c().store.nodes()
        ]

    @app.get("/v1/workers")
    async def workers() -> list[dict[str, Any]]:
        out = []
        for t in c().store.tasks(live_only=True):
            for w in c().store.workers(t.name, t.generation):
                out.append(w.as_dict())
        return out

    @app.get("/v1/events")
    async def events(since: int = 0, task: str | None = None, limit: int = 1000) -> list[dict[str, Any]]:
        return [e.as_dict() for e in c().store.events(since, task, limit)]

    @app.post("/v1/agents/register")
    async def register(reg: Registration) -> RegistrationReply:
        return c().register(reg)

    @app.post("/v1/agents/heartbeat")
    async def heartbeat(hb: Heartbeat) -> HeartbeatReply:
        return c().heartbeat(hb)

    @app.get("/v1/agents/{node}/orders")
    async def orders(node: str, wait: float = 2.0, acked: int = 0) -> OrderBatch:
        """Long poll: answers once there are orders for the node not acknowledged yet
        (``acked``: the last one carried out), or after ``wait`` seconds."""
        wait = wait if math.isfinite(wait) else 0.0
        deadline = time.monotonic() + min(max(wait, 0.0), 30.0)
        event = wakeups.setdefault(node, asyncio.Event())
        while True:
            event.clear()  # before taking, so that an order queued meanwhile wakes us
            found = c().orders(node, acked)
            left = deadline - time.monotonic()
            if found.orders or left <= 0:
                return found
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), left)

    return app

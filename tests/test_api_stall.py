"""No submission under 1 MiB stalls the coordinator's loop (issue 53): the worst bodies the probe
found (a 10,000-task list, a 10,000-variable env, a 100,000-deep document, in JSON and YAML, and
a body of 100,000 values each within its own bound) are refused quickly, each naming the field
and the limit, while 100 agents keep heartbeating through the real app (in process: the app and
the agents share one event loop, so a parse on the loop would hold up every heartbeat)."""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from pathlib import Path

import httpx

from unicron.control.coordinator import CoordinatorSettings
from unicron.control.service.service import create_app
from unicron.control.service.tokens import issue
from unicron.control.store.secret import load_or_create_secret
from unicron.core.access import Role
from unicron.core.limits import MAX_BODY_BYTES

AGENTS, BEAT_EVERY_S = 100, 0.5
MANY, DEEP = 10_000, 100_000  # entries of the longest lists, levels of the deepest documents
TASK = {"name": "t", "weight": 1, "run": {"program": ["p"], "iterations": 1}}


def yaml_task(i: int, env: str = "", args: int = 0) -> str:
    program = ", ".join(["p"] + ["a"] * args)
    return f"  - name: t{i}\n    weight: 1\n    run:\n      program: [{program}]\n      iterations: 1\n{env}"


def worst_bodies() -> list[tuple[str, str, str]]:
    """(body, content type, what the refusal must say): each under 1 MiB."""
    many = json.dumps({"tasks": [{**TASK, "name": f"t{i}"} for i in range(MANY)]})
    env = {f"K{i}": "v" for i in range(MANY)}
    wide_env = "".join(f"        K{j}: v\n" for j in range(256))
    full = "tasks:\n" + "".join(yaml_task(i, f"      env:\n{wide_env}", 500) for i in range(100))
    bodies = [
        (many, "application/json", "tasks: more than 100 tasks"),
        (
            "tasks:\n" + "".join(yaml_task(i) for i in range(MANY)),
            "application/yaml",
            "more than 100 tasks",
        ),
        (
            json.dumps({**TASK, "run": {**TASK["run"], "env": env}}),
            "application/json",
            "run.env: more than 256",
        ),
        ('{"name": ' + "[" * DEEP + "]" * DEEP + "}", "application/json", "nested deeper than 64"),
        ("- " * DEEP + "x", "application/yaml", "nested deeper than 64 levels"),
        (full, "application/yaml", "more than 100000 values"),
    ]
    assert all(len(body) < MAX_BODY_BYTES for body, _, _ in bodies)
    return bodies


async def heartbeats(client: httpx.AsyncClient, tokens: dict[str, str], until: asyncio.Event) -> list[float]:
    """Every agent heartbeats every BEAT_EVERY_S (staggered) until ``until``: each one's latency."""
    latencies: list[float] = []

    async def agent(index: int, node: str) -> None:
        await asyncio.sleep(BEAT_EVERY_S * index / AGENTS)
        while not until.is_set():
            started = time.perf_counter()
            answer = await client.post("/v1/agents/heartbeat", json={"node": node}, headers=tokens[node])
            latencies.append(time.perf_counter() - started)
            assert answer.status_code == 200 and answer.json()["registered"], answer.text
            await asyncio.sleep(BEAT_EVERY_S)

    await asyncio.gather(*(agent(i, node) for i, node in enumerate(tokens)))
    return latencies


async def heartbeats_while(
    client: httpx.AsyncClient, tokens: dict[str, str], work: asyncio.Future[None]
) -> list[float]:
    until = asyncio.Event()
    beating = asyncio.create_task(heartbeats(client, tokens, until))
    await work
    until.set()
    return await beating


def p99(latencies: list[float]) -> float:
    return statistics.quantiles(latencies, n=100)[98]


async def scenario(tmp_path: Path) -> tuple[list[float], list[float], list[float]]:
    state = tmp_path / "state"
    secret = load_or_create_secret(state)
    admin = {"authorization": f"Bearer {issue(secret, Role.ADMIN, 'ops')}"}
    tokens = {
        f"n{i}": {"authorization": f"Bearer {issue(secret, Role.AGENT, f'n{i}')}"} for i in range(AGENTS)
    }
    channel = create_app(CoordinatorSettings(state_dir=state, checkpoint_root=tmp_path / "ckpt"))
    fastapi = channel.app
    async with fastapi.router.lifespan_context(fastapi):  # type: ignore[attr-defined]
        transport = httpx.ASGITransport(app=channel)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://coordinator", timeout=60
        ) as client:
            registered = await asyncio.gather(
                *(
                    client.post("/v1/agents/register", json={"node": n, "slots": 2}, headers=t)
                    for n, t in tokens.items()
                )
            )
            assert all(r.status_code == 200 for r in registered), registered[0].text
            quiet = await heartbeats_while(client, tokens, asyncio.ensure_future(asyncio.sleep(1.0)))
            took: list[float] = []

            async def submit_worst() -> None:
                await asyncio.sleep(0.5)
                for body, kind, says in worst_bodies():
                    started = time.perf_counter()
                    answer = await client.post(
                        "/v1/tasks", content=body, headers={**admin, "content-type": kind}
                    )
                    took.append(time.perf_counter() - started)
                    assert answer.status_code == 422 and says in answer.json()["error"], answer.text[:300]
                await asyncio.sleep(0.5)

            loaded = await heartbeats_while(client, tokens, asyncio.ensure_future(submit_worst()))
            assert (await client.get("/v1/tasks", headers=admin)).json() == []
    return quiet, loaded, took


def test_the_worst_bodies_are_refused_quickly_and_heartbeats_keep_flowing(tmp_path: Path) -> None:
    """Heartbeats' p99 while the worst bodies are refused stays under 100 ms, or under five
    times the p99 of the same agents with no submission (measured just before, on the same
    machine, so that a machine loaded by other work raises both): not a tight timing, but one
    that a stall of a second (the probe measured 4 to 35 s) cannot pass. Each body refused at
    its first entry or level past a bound takes under 5 s, also generous (a fraction of a second
    here, a loaded machine); the last one, within every bound but the count of values, is read
    to its 100,001st value, in a thread, and only its answer is checked."""
    quiet, loaded, took = asyncio.run(scenario(tmp_path))
    assert len(quiet) >= AGENTS and len(loaded) >= AGENTS
    bound = max(0.1, 5 * p99(quiet))
    refusals = [round(t, 3) for t in took]
    print(f"heartbeat p99 quiet {p99(quiet):.4f} s, loaded {p99(loaded):.4f} s; refusals {refusals}")
    assert p99(loaded) < bound, (p99(quiet), p99(loaded), max(loaded))
    assert max(took[:-1]) < 5.0, took

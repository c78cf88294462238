"""An agent's registration and heartbeat are bounded (issue 53): every list, mapping and text in
them has a bound (``core/limits.py``) that the models enforce and that the agents' channel checks
on the parsed body before any model is built (``core/protocol.py``: AGENT_BOUNDS), so the worst
heartbeat under 1 MiB is refused, naming the field and the limit, having validated nothing; and
the real agent never reaches a bound: it splits a backlog of reports across heartbeats and lists
at most the workers the bound allows. In process, through the real app; no worker processes."""

from __future__ import annotations

import asyncio
import json
import time
import typing
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from unicron.cli.live import check_node_size
from unicron.control.agent.agent import Agent
from unicron.control.agent.processes import Worker
from unicron.control.agent.stackdump import shared
from unicron.control.coordinator import CoordinatorSettings
from unicron.control.service.service import create_app
from unicron.control.service.tokens import issue
from unicron.control.store.secret import load_or_create_secret
from unicron.core import limits
from unicron.core.access import Role
from unicron.core.errors import UsageError
from unicron.core.limits import EntryBounds
from unicron.core.names import NAME_PATTERN
from unicron.core.protocol import (
    AGENT_BOUNDS,
    ExceptionReport,
    ExitReport,
    Heartbeat,
    IterationReport,
    LaunchWorker,
    Phase,
    Progress,
    Registration,
    RestoredReport,
    StacksReport,
    WorkerReport,
    WorkerState,
)
from unicron.core.ranges import field_path, size_bounds

WORKER = {"task": "t", "generation": 1, "rank": 0, "pid": 1, "running": True}
REPORT = {"task": "t", "generation": 1, "rank": 0, "step": 1}
STEP = {**REPORT, "type": "iteration", "duration_s": 0.1, "samples": 1}
STACKS = {"type": "stacks", "task": "t", "generation": 1, "node": "n", "stacks": {}}
RESTORED = {**REPORT, "type": "restored", "source": "persistent"}
EXCEPTION = {**REPORT, "type": "exception", "error_type": "E", "message": "m"}
REPORTS = typing.get_args(typing.get_args(WorkerReport)[0])  # each kind's model
MESSAGES = [Registration, Heartbeat, WorkerState, Progress, *REPORTS]


@pytest.mark.parametrize("model", [Registration, Heartbeat], ids=["registration", "heartbeat"])
def test_every_list_mapping_and_text_of_an_agents_message_is_bounded(model: type) -> None:
    """Each text has a length, each list and mapping the same bound in its model and in
    AGENT_BOUNDS (checked before the model is built), and no message has more fields than a
    message's mapping may hold."""
    for s in size_bounds(model):
        if s.kind == "text":
            assert s.most is not None or s.pattern == NAME_PATTERN, f"{s.path}: give it a max_length"
            continue
        bound = AGENT_BOUNDS.bounds.get(field_path(s.path))
        assert bound is not None, f"{s.path}: bound it in AGENT_BOUNDS, checked before validation"
        assert s.most == bound.entries, f"{s.path}: its model says {s.most}, AGENT_BOUNDS {bound.entries}"
    assert all(len(m.model_fields) <= limits.MAX_FIELDS for m in MESSAGES)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, dict[str, str]]]:
    """One service for the module, and an agent token for node ``n`` (registered)."""
    tmp_path = tmp_path_factory.mktemp("bounds")
    state = tmp_path / "state"
    agent = {"authorization": f"Bearer {issue(load_or_create_secret(state), Role.AGENT, 'n')}"}
    settings = CoordinatorSettings(state_dir=state, checkpoint_root=tmp_path / "ckpt")
    with TestClient(create_app(settings), headers=agent, raise_server_exceptions=False) as client:
        assert client.post("/v1/agents/register", json={"node": "n", "slots": 2}).status_code == 200
        yield client, agent


def over(count: int, item: Any) -> list[Any]:
    return [item] * (count + 1)


PAST_A_COUNT = [
    ("heartbeat", {"workers": over(limits.MAX_LISTED_WORKERS, WORKER)}, "body.workers", ("workers",)),
    ("heartbeat", {"reports": over(limits.MAX_REPORTS_PER_BEAT, STEP)}, "body.reports", ("reports",)),
    (
        "heartbeat",
        {"reports": [STEP, {**STACKS, "stacks": {str(i): "" for i in range(limits.MAX_LISTED_WORKERS + 1)}}]},
        "body.reports.1.stacks",
        ("reports", "[]", "stacks"),
    ),
    (
        "heartbeat",
        {"reports": [{**STACKS, "unreachable": over(limits.MAX_PEERS, "p")}]},
        "body.reports.0.unreachable",
        ("reports", "[]", "unreachable"),
    ),
    (
        "heartbeat",
        {"reports": [{**RESTORED, "path": "p", "skipped": over(limits.MAX_SKIPPED, ["f", "why"])}]},
        "body.reports.0.skipped",
        ("reports", "[]", "skipped"),
    ),
    ("heartbeat", {f"k{i}": 1 for i in range(limits.MAX_FIELDS)}, "body", ()),
    (
        "heartbeat",
        {"workers": [WORKER, {**WORKER, **{f"k{i}": 1 for i in range(limits.MAX_FIELDS)}}]},
        "body.workers.1",
        ("workers", "[]"),
    ),
    ("register", {"slots": 2, "gpus": over(limits.MAX_SLOTS, "0")}, "body.gpus", ("gpus",)),
    (
        "register",
        {"slots": 2, "workers": over(limits.MAX_LISTED_WORKERS, WORKER)},
        "body.workers",
        ("workers",),
    ),
]


@pytest.mark.parametrize("route, body, path, bounded", PAST_A_COUNT)
def test_a_count_past_its_bound_is_refused_naming_the_field_and_the_limit(
    service: tuple[TestClient, dict[str, str]],
    route: str,
    body: dict[str, Any],
    path: str,
    bounded: tuple[str, ...],
) -> None:
    client, _ = service
    answer = client.post(f"/v1/agents/{route}", json={"node": "n", **body})
    assert answer.status_code == 422, answer.text[:300]
    bound = AGENT_BOUNDS.bounds[bounded]
    said = f"more than {bound.entries} {bound.what}"
    assert answer.json() == {
        "error": f"{path}: {said}; fix: {bound.fix}",
        "problems": [{"path": path, "message": said, "fix": bound.fix}],
    }


PAST_A_LENGTH = [
    ("register", {"slots": limits.MAX_SLOTS + 1}, "body.slots", f"less than or equal to {limits.MAX_SLOTS}"),
    (
        "heartbeat",
        {"workers": [{**WORKER, "task": "t" * (limits.MAX_LABEL_CHARS + 1)}]},
        "body.workers.0.task",
        f"at most {limits.MAX_LABEL_CHARS} characters",
    ),
    (
        "heartbeat",
        {"reports": [{**EXCEPTION, "traceback": "x" * (limits.MAX_NOTE_CHARS + 1)}]},
        "body.reports.0.exception.traceback",
        f"at most {limits.MAX_NOTE_CHARS} characters",
    ),
    (
        "heartbeat",
        {"reports": [{**STACKS, "stacks": {"0": "x" * (limits.MAX_STACK_CHARS + 1)}}]},
        "body.reports.0.stacks.stacks.0",
        f"at most {limits.MAX_STACK_CHARS} characters",
    ),
]


@pytest.mark.parametrize("route, body, path, says", PAST_A_LENGTH)
def test_a_text_or_number_past_its_bound_is_refused_by_the_model_naming_it(
    service: tuple[TestClient, dict[str, str]], route: str, body: dict[str, Any], path: str, says: str
) -> None:
    client, _ = service
    answer = client.post(f"/v1/agents/{route}", json={"node": "n", **body})
    assert answer.status_code == 422, answer.text[:300]
    (problem,) = answer.json()["problems"]
    assert problem["path"] == path and says in problem["message"] and problem["fix"], problem


def worst_bodies() -> list[tuple[bytes, str]]:
    """Heartbeats under 1 MiB that each held the loop for up to minutes, with the field each
    refusal names: as many workers, reports, stacks or fields as fit."""
    bodies = [
        ({"workers": [{**WORKER, "rank": i} for i in range(13_000)]}, "body.workers"),
        ({"reports": [{**STEP, "step": i + 1} for i in range(8000)]}, "body.reports"),
        ({"reports": [{**STACKS, "stacks": {str(i): "" for i in range(80_000)}}]}, "body.reports.0.stacks"),
        ({f"k{i}": 1 for i in range(80_000)}, "body"),
        ({"reports": [{**STACKS, "unreachable": ["p"] * 200_000}]}, "body.reports.0.unreachable"),
    ]
    out = [(json.dumps({"node": "n", **body}).encode(), path) for body, path in bodies]
    assert all(len(body) <= limits.MAX_BODY_BYTES for body, _ in out)
    return out


def test_the_worst_heartbeats_are_refused_before_any_model_is_built(
    service: tuple[TestClient, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counted rather than timed: the model is never asked to validate them (the counts are
    checked on the parsed body, each list counted before its entries are visited), while a
    heartbeat within its bounds is validated once."""
    client, _ = service
    validated: list[type] = []
    for name in ("model_validate", "model_validate_json"):
        real = getattr(Heartbeat, name)

        def counting(cls: type, *args: Any, _real: Any = real, **kwargs: Any) -> Any:
            validated.append(cls)
            return _real(*args, **kwargs)

        monkeypatch.setattr(Heartbeat, name, classmethod(counting))
    for body, path in worst_bodies():
        answer = client.post("/v1/agents/heartbeat", content=body)
        assert answer.status_code == 422 and answer.json()["problems"][0]["path"] == path, answer.text[:300]
        assert len(answer.content) < 1000
    assert validated == []
    assert client.post("/v1/agents/heartbeat", json={"node": "n", "reports": [STEP]}).status_code == 200
    assert validated == [Heartbeat]


# ------------------------------------------------------------------ the real agent's heartbeats

TASK = "t" * 63  # the longest task name


def worker(index: int, exited: bool, logs: Path) -> Worker:
    """A worker as its agent sees it, its process faked (a pid no process has: none is touched)."""
    order = LaunchWorker(task=TASK, generation=1, rank=index, world_size=1, local_rank=0, argv=["p"])
    process = SimpleNamespace(pid=10**9 + index, returncode=1 if exited else None)
    made = Worker(order, process, logs / f"{index}.log")  # type: ignore[arg-type]
    made.exited = exited
    made.last_position = Progress(pid=process.pid, step=10**6, phase=Phase.COLLECTIVE, what="w" * 24)
    return made


def backlog() -> list[WorkerReport]:
    """What a node buffers through a partition (four heartbeats' worth), the largest of each kind
    among them: exceptions as the worker cuts them, a restore that passed over as many copies as
    may be named, every slot's stack and a 2,048-node task's peers all unreachable."""
    now = time.time()
    big: list[WorkerReport] = [
        ExceptionReport(
            task=TASK, generation=1, rank=0, step=1, error_type="E", message="m" * 2000, traceback="t" * 4000
        ),
        RestoredReport(
            task=TASK,
            generation=1,
            rank=0,
            step=1,
            source="persistent",
            path="p" * 200,
            skipped=[("p" * 200, "w" * 200)] * limits.MAX_SKIPPED,
        ),
        StacksReport(
            task=TASK,
            generation=1,
            node="n",
            stacks=shared({r: "s" * limits.MAX_STACK_CHARS for r in range(limits.MAX_SLOTS)}),
            unreachable=[f"n{i}" for i in range(2048)],
        ),
    ]
    steps: list[WorkerReport] = [
        IterationReport(task=TASK, generation=1, rank=0, step=i + 1, duration_s=0.1, samples=1, time=now)
        for i in range(4 * limits.MAX_REPORTS_PER_BEAT - 3 * len(big))
    ]
    return steps[:1000] + big * 3 + steps[1000:]


async def deliver(tmp_path: Path, agent: Agent) -> tuple[list[Heartbeat], list[list[int]]]:
    """Register ``agent`` with the real app and heartbeat until its backlog is sent: the
    heartbeats the coordinator took, and the order numbers each answer carried."""
    state = tmp_path / "state"
    token = issue(load_or_create_secret(state), Role.AGENT, agent.node)
    channel = create_app(CoordinatorSettings(state_dir=state, checkpoint_root=tmp_path / "ckpt"))
    took: list[Heartbeat] = []
    numbers: list[list[int]] = []

    def take(orders: list[Any], got: list[int]) -> None:  # nothing is stopped
        numbers.append(got)

    agent._take = take  # type: ignore[method-assign]
    app = channel.app
    async with app.router.lifespan_context(app):  # type: ignore[attr-defined]
        coordinator = channel.agents.c
        real = coordinator.heartbeat

        def heartbeat(hb: Heartbeat) -> Any:
            took.append(hb)
            return real(hb)

        coordinator.heartbeat = heartbeat  # type: ignore[method-assign]
        transport = httpx.ASGITransport(app=channel)
        headers = {"authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(transport=transport, headers=headers, timeout=60) as client:
            await agent._register(client)
            while await agent._beat(client):
                pass
    return took, numbers


def test_the_largest_heartbeats_a_real_agent_sends_are_taken_and_a_backlog_is_split(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A node of the most slots listing the most workers (its slots running, the rest exited in
    the last minute), with the longest task names, sends a partition's backlog of reports: each
    heartbeat holds at most MAX_REPORTS_PER_BEAT within the body's limit, every one is accepted,
    every report arrives once and in order, none is dropped. The coordinator orders each stray
    worker stopped once: the answers that follow repeat those orders and add none."""
    agent = Agent("http://coordinator", "n", limits.MAX_SLOTS, tmp_path / "agent")
    for index in range(limits.MAX_LISTED_WORKERS):
        agent.supervisor.workers[(TASK, 1, index)] = worker(index, index >= limits.MAX_SLOTS, tmp_path)
    sent = backlog()
    agent.backlog.reports = list(sent)
    took, numbers = asyncio.run(deliver(tmp_path, agent))
    assert [len(hb.workers) for hb in took] == [limits.MAX_LISTED_WORKERS] * len(took)
    assert all(0 < len(hb.reports) <= limits.MAX_REPORTS_PER_BEAT for hb in took)
    assert len(took) > len(sent) // limits.MAX_REPORTS_PER_BEAT  # the byte limit split some too
    assert [r for hb in took for r in hb.reports] == sent
    assert agent.backlog.reports == [] and "dropped" not in capsys.readouterr().err
    assert len(numbers[0]) == limits.MAX_SLOTS and all(n == numbers[0] for n in numbers)


def test_a_worker_is_listed_until_its_exit_is_sent_and_the_oldest_told_ones_go_first(tmp_path: Path) -> None:
    """An exited worker stays listed while its exit report waits (the coordinator would take a
    running worker its node no longer lists for a lost one); past MAX_LISTED_WORKERS the oldest
    exited ones whose exits were sent are let go at once, the running ones kept."""
    agent = Agent("http://coordinator", "n", 2, tmp_path / "agent")
    old = worker(0, True, tmp_path)
    old.started -= 120  # a minute past the agent's keeping
    agent.supervisor.workers[(TASK, 1, 0)] = old
    agent.supervisor.heard(ExitReport(task=TASK, generation=1, rank=0, node="n", code=1, signal=None))
    # Its exit waits: still listed, and said to wait (the coordinator hears it from the report).
    assert [(w.rank, w.exit_unsent) for w in agent.supervisor.listed()] == [(0, True)]
    agent.backlog.reports.clear()  # sent
    assert agent.supervisor.listed() == []
    most = limits.MAX_LISTED_WORKERS
    agent.supervisor.workers = {(TASK, 1, i): worker(i, i >= 2, tmp_path) for i in range(most + 10)}
    assert [w.rank for w in agent.supervisor.listed()] == [0, 1, *range(12, most + 10)]


def test_stacks_are_shared_so_that_a_report_fits_a_heartbeat() -> None:
    many = shared({r: "s" * limits.MAX_STACK_CHARS for r in range(limits.MAX_SLOTS)})
    assert sum(map(len, many.values())) <= limits.MAX_STACKS_CHARS
    assert all(text.endswith("characters)") for text in many.values())
    few = {0: "a" * 100, 1: "b" * limits.MAX_STACK_CHARS}
    assert shared(few) == few  # two workers' dumps fit whole


@pytest.mark.parametrize(
    "slots, gpus, says",
    [
        (0, [], f"give 1 to {limits.MAX_SLOTS} worker slots"),
        (limits.MAX_SLOTS + 1, [], f"give 1 to {limits.MAX_SLOTS} worker slots"),
        (2, ["0"] * (limits.MAX_SLOTS + 1), f"give at most {limits.MAX_SLOTS}"),
        (2, ["g" * (limits.MAX_LABEL_CHARS + 1)], f"ids of at most {limits.MAX_LABEL_CHARS}"),
    ],
)
def test_the_agent_refuses_at_start_what_the_coordinator_would_refuse(
    slots: int, gpus: list[str], says: str
) -> None:
    with pytest.raises(UsageError, match=says):
        check_node_size(slots, gpus)
    check_node_size(limits.MAX_SLOTS, ["0"] * limits.MAX_SLOTS)


def test_a_bound_path_whose_prefix_is_unbounded_is_refused_when_declared() -> None:
    """A check goes only through bounded lists and mappings: a path under an unbounded one would
    make it walk that one whole."""
    with pytest.raises(ValueError, match=r"bound \('reports',\) too"):
        EntryBounds({(): AGENT_BOUNDS.bounds[()], ("reports", "[]"): AGENT_BOUNDS.bounds[()]})
    assert AGENT_BOUNDS.first_excess("not a mapping", "body") is None  # (the model refuses it)

"""Hostile input to the coordinator's API (the real app and store in process): each finding of
the probe in issue 13 answered by a clear 4xx that quotes no more than a few characters of the
input, with nothing created and the service still answering."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from unicron.control.coordinator import CoordinatorSettings
from unicron.control.service.service import create_app
from unicron.control.service.tokens import issue
from unicron.control.store.secret import load_or_create_secret
from unicron.core import limits
from unicron.core.access import Role

from .test_api_stall import AGENTS, DEEP, MANY

TASK = "{name: %s, weight: 1, throughput: {1: 1.0e9}, run: {program: [python, x.py], iterations: 5}}"


def alias_bomb() -> str:
    """A few hundred bytes of YAML whose aliases expand to 9**9 (387 million) strings."""
    lines = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for previous, name in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"{name}: &{name} [{', '.join([f'*{previous}'] * 9)}]")
    return "\n".join([*lines, "name: [*i]"]) + "\n"


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    state = tmp_path / "state"
    admin = {"authorization": f"Bearer {issue(load_or_create_secret(state), Role.ADMIN, 'ops')}"}
    settings = CoordinatorSettings(state_dir=state, checkpoint_root=tmp_path / "ckpt")
    with TestClient(create_app(settings), headers=admin, raise_server_exceptions=False) as c:
        yield c


def refused(client: TestClient, status: int, body: str | bytes) -> str:
    """Submit ``body``: it must get ``status`` with a short error, and create no task."""
    response = client.post("/v1/tasks", content=body, headers={"content-type": "application/yaml"})
    assert response.status_code == status, response.text[:300]
    assert len(response.content) < 2000  # names the problem; never echoes the input
    assert client.get("/v1/tasks").json() == []
    return str(response.json()["error"])


def test_a_yaml_alias_bomb_is_refused_before_it_expands(client: TestClient) -> None:
    bomb = alias_bomb()
    assert len(bomb) < 600
    assert "aliases expanded" in refused(client, 422, bomb)


def test_deep_nesting_and_big_bodies_are_refused(client: TestClient) -> None:
    assert "nested deeper than" in refused(client, 422, "[" * 100_000 + "]" * 100_000)
    assert "nested deeper than" in refused(client, 422, '{"name": ' + "[" * 100_000 + "]" * 100_000 + "}")
    big = (TASK % "big").replace("x.py", "x" * 10_000_000)
    assert "larger than 1048576 bytes" in refused(client, 413, big)


def test_a_submission_is_taken_whole_or_not_at_all(client: TestClient) -> None:
    one_bad = f"tasks:\n  - {TASK % 'good'}\n  - {(TASK % 'bad').replace('weight: 1', 'weight: -1')}\n"
    assert "tasks[1](bad).weight" in refused(client, 422, one_bad)
    twice = f"tasks:\n  - {TASK % 'same'}\n  - {TASK % 'same'}\n"
    assert "appears twice" in refused(client, 422, twice)


def test_numbers_names_and_echoes(client: TestClient) -> None:
    assert "boolean is not a number" in refused(
        client, 422, (TASK % "b").replace("weight: 1", "weight: true")
    )
    for name in ("../etc", ".hidden", "a/b", "x" * 64):
        assert "name" in refused(client, 422, TASK % f'"{name}"')
    long_value = (TASK % "t").replace("weight: 1", f"weight: {'9' * 5000}x")
    assert "..." in refused(client, 422, long_value)  # the bad value is quoted, cut short


def test_queries_and_agent_messages_out_of_bounds(client: TestClient, tmp_path: Path) -> None:
    assert client.get("/v1/events", params={"since": 2**70}).status_code == 422
    assert client.get("/v1/events", params={"limit": -5}).status_code == 422
    agent = {"authorization": f"Bearer {issue(load_or_create_secret(tmp_path / 'state'), Role.AGENT, 'n')}"}
    for wait in ("nan", "inf", "-1", "31"):
        answer = client.get("/v1/agents/n/orders", params={"wait": wait}, headers=agent)
        assert answer.status_code == 422 and answer.json()["problems"][0]["path"] == "query.wait"
    bad = [{"node": "n", "slots": True}, {"node": "../n", "slots": 2}, {"node": "n", "slots": 2**70}]
    for body in bad:
        assert client.post("/v1/agents/register", json=body, headers=agent).status_code in (403, 422)
    assert client.get("/v1/nodes").json() == []
    assert client.get("/health").json() == {"status": "ok"}


def test_heartbeats_and_long_polls_out_of_bounds(client: TestClient, tmp_path: Path) -> None:
    """The agents' lean channel (control/service/agentchannel.py) refuses as FastAPI's routes do."""
    agent = {"authorization": f"Bearer {issue(load_or_create_secret(tmp_path / 'state'), Role.AGENT, 'n')}"}
    beat = client.post("/v1/agents/heartbeat", json={"node": "n", "acked": 2**70}, headers=agent)
    assert beat.status_code == 422 and beat.json()["problems"][0]["path"] == "body.acked"
    assert "fix" in beat.json()["problems"][0]
    garbage = client.post("/v1/agents/heartbeat", content=b"{not json", headers=agent)
    assert garbage.status_code == 422 and garbage.json()["error"] == "invalid request"
    huge = {"node": "n", "reports": [{"type": "exception", "message": "x" * (2 << 20)}]}
    assert client.post("/v1/agents/heartbeat", json=huge, headers=agent).status_code == 413
    unknown = client.post("/v1/agents/heartbeat", json={"node": "n"}, headers=agent)
    assert unknown.status_code == 200 and unknown.json()["registered"] is False  # register first
    forged = client.post("/v1/agents/heartbeat", json={"node": "n"}, headers={"authorization": "Bearer x"})
    assert forged.status_code == 401 and forged.headers["www-authenticate"] == "Bearer"
    admin_beat = client.post("/v1/agents/heartbeat", json={"node": "n"})  # the client's admin token
    assert admin_beat.status_code == 403 and "needs a agent token" in admin_beat.json()["error"]
    last = client.get("/v1/agents/n/orders?wait=40&wait=0&acked=0", headers=agent)
    assert last.status_code == 200 and last.json() == {"orders": [], "numbers": []}  # the last wait counts
    assert client.get("/v1/agents/n/extra/orders", headers=agent).status_code == 404


def test_counts_past_their_bounds_are_refused_naming_the_field_and_the_limit(client: TestClient) -> None:
    """Checked as the body is parsed, before any model is built (core/safeyaml.py); each bound
    is the model's own (core/limits.py), so a body that slips past one is refused by the other."""
    args = ", ".join(["a"] * 1024)
    assert "run.program: more than 1024 arguments" in refused(
        client, 422, (TASK % "t").replace("program: [python, x.py]", f"program: [python, {args}]")
    )
    faults = ", ".join(["{action: kill, rank: 0, step: 1}"] * 257)
    assert "tasks[0].run.faults: more than 256 faults" in refused(
        client,
        422,
        "tasks:\n  - " + (TASK % "t").replace("iterations: 5", f"iterations: 5, faults: [{faults}]"),
    )
    rows = ", ".join(f"{n}: 1.0e9" for n in range(1, 1026))
    assert "throughput: more than 1024 rows" in refused(
        client, 422, (TASK % "t").replace("{1: 1.0e9}", f"{{{rows}}}")
    )
    long_text = '{"name": "t", "weight": 1, "run": {"program": ["' + "x" * 70_000 + '"], "iterations": 1}}'
    assert "longer than 65536 characters" in refused(client, 422, long_text)


def test_the_limits_docs_security_md_states_are_the_enforced_ones() -> None:
    text = " ".join((Path(__file__).parents[1] / "docs" / "security.md").read_text().split())
    stated = [
        f"request bodies over {limits.MAX_BODY_BYTES >> 20} MiB are refused with 413",
        f"more than {limits.MAX_SPEC_NODES:,} values counting aliases expanded",
        f"nests deeper than {limits.MAX_SPEC_DEPTH} levels",
        f"at most {limits.MAX_TASKS_PER_SUBMIT} tasks, a task's `run.env` {limits.MAX_ENV_KEYS} variables",
        f"`run.program` {limits.MAX_ARGS} arguments, `run.faults` {limits.MAX_FAULTS} faults",
        f"`throughput` {limits.MAX_TABLE_ROWS} rows, any other list or mapping {limits.MAX_ENTRIES} entries",
        f"any text {limits.MAX_TEXT_CHARS} characters",
        f"cut to {limits.MAX_ECHO_CHARS} characters",
        "within ±(2^53 - 1)" if limits.MAX_JSON_INT == 2**53 - 1 else "the bound in core/limits.py",
        f"(a {MANY:,}-task list, a {MANY:,}-variable env, a {DEEP:,}-deep document, a body of",
        f"{limits.MAX_SPEC_NODES:,} values each within its own bound) while {AGENTS} agents heartbeat",
    ]
    for phrase in stated:
        assert phrase in text, (
            f"docs/security.md no longer says {phrase!r}: make it say what core/limits.py does"
        )

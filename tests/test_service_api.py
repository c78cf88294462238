"""The coordinator's REST API in process (real app, real SQLite store): errors name the fix."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from unicron.control.coordinator import CoordinatorSettings
from unicron.control.service.service import create_app
from unicron.control.service.tokens import issue
from unicron.control.store.secret import load_or_create_secret
from unicron.core.access import Role

TASK = """
name: t1
weight: 2
throughput: {2: 1.0e9, 4: 1.8e9}
run: {program: [python, train.py, --steps, 10], iterations: 10}
"""


def bearer(state: Path, role: Role, subject: str) -> dict[str, str]:
    return {"authorization": f"Bearer {issue(load_or_create_secret(state), role, subject)}"}


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    """A client with an admin token (the agent calls below carry their own node's token)."""
    settings = CoordinatorSettings(state_dir=tmp_path / "state", checkpoint_root=tmp_path / "ckpt")
    with TestClient(create_app(settings), headers=bearer(settings.state_dir, Role.ADMIN, "me")) as c:
        yield c


def test_submit_list_cancel(client: TestClient) -> None:
    created = client.post("/v1/tasks", content=TASK, headers={"content-type": "application/yaml"})
    assert created.status_code == 201, created.text
    assert created.json()[0]["name"] == "t1" and created.json()[0]["state"] == "waiting"
    assert [t["name"] for t in client.get("/v1/tasks").json()] == ["t1"]
    cancelled = client.delete("/v1/tasks/t1")
    assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
    kinds = [e["kind"] for e in client.get("/v1/events").json()]
    assert "task_submitted" in kinds and "task_cancelled" in kinds


def test_an_ended_task_is_cancelled_again_harmlessly_and_its_name_runs_anew(client: TestClient) -> None:
    """Cancelling an ended task changes nothing and says so (`cancelled`: false, its state);
    submitting its name again runs a new task, the ended one kept as NAME#RUN."""
    assert client.post("/v1/tasks", content=TASK).status_code == 201
    first = client.delete("/v1/tasks/t1")
    assert first.status_code == 200 and (first.json()["state"], first.json()["cancelled"]) == (
        "cancelled",
        True,
    )
    again = client.delete("/v1/tasks/t1")
    assert again.status_code == 200 and (again.json()["state"], again.json()["cancelled"]) == (
        "cancelled",
        False,
    )
    created = client.post("/v1/tasks", content=TASK.replace("iterations: 10", "iterations: 20"))
    assert created.status_code == 201, created.text
    assert (created.json()[0]["state"], created.json()[0]["run"], created.json()[0]["iterations"]) == (
        "waiting",
        2,
        20,
    )
    tasks = {t["name"]: t for t in client.get("/v1/tasks").json()}
    assert (tasks["t1#1"]["state"], tasks["t1#1"]["run"], tasks["t1#1"]["iterations"]) == ("cancelled", 1, 10)
    assert client.get("/v1/tasks/t1%231").json()["state"] == "cancelled"  # readable by its new name
    replaced = [
        e for e in client.get("/v1/events", params={"task": "t1"}).json() if e["kind"] == "task_replaced"
    ]
    assert [(e["detail"]["kept_as"], e["detail"]["state"]) for e in replaced] == [("t1#1", "cancelled")]


def test_bad_spec_names_field_and_fix(client: TestClient) -> None:
    bad = TASK.replace("weight: 2", "weight: -2").replace("iterations: 10", "iterations: 0")
    response = client.post("/v1/tasks", content=bad)
    assert response.status_code == 422
    paths = {p["path"] for p in response.json()["problems"]}
    assert {"weight", "run.iterations"} <= paths
    assert all(p["fix"] for p in response.json()["problems"])
    assert client.post("/v1/tasks", content="name: [unclosed").status_code == 422


def test_duplicate_and_unknown_tasks(client: TestClient) -> None:
    assert client.post("/v1/tasks", content=TASK).status_code == 201
    again = client.post("/v1/tasks", content=TASK)  # t1 is live (waiting): its name is taken
    assert again.status_code == 409 and "cancel it first (`unicron cancel t1`)" in again.json()["error"]
    missing = client.get("/v1/tasks/nobody")
    assert missing.status_code == 404 and "no task named 'nobody'" in missing.json()["error"]
    assert client.delete("/v1/tasks/nobody").status_code == 404


def test_agents_register_and_heartbeat(client: TestClient, tmp_path: Path) -> None:
    a, b, ghost = (bearer(tmp_path / "state", Role.AGENT, node) for node in ("a", "b", "ghost"))
    assert client.post("/v1/agents/register", json={"node": "a", "slots": 2}, headers=a).status_code == 200
    mismatch = client.post("/v1/agents/register", json={"node": "b", "slots": 4}, headers=b)
    assert mismatch.status_code == 409 and "--slots" in mismatch.json()["error"]
    assert client.post("/v1/agents/heartbeat", json={"node": "a"}, headers=a).json()["registered"] is True
    unknown = client.post("/v1/agents/heartbeat", json={"node": "ghost"}, headers=ghost)
    assert unknown.json()["registered"] is False
    bad = client.post("/v1/agents/register", json={"node": "a", "slots": 0}, headers=a)
    assert bad.status_code == 422 and bad.json()["problems"][0]["path"] == "body.slots"
    nodes = client.get("/v1/nodes").json()
    assert [n["name"] for n in nodes] == ["a"] and nodes[0]["state"] == "healthy"


def test_openapi_spec_lists_the_api(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    for path in ("/v1/tasks", "/v1/tasks/{name}", "/v1/nodes", "/v1/events", "/v1/agents/heartbeat"):
        assert path in spec["paths"]

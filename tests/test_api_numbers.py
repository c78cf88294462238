"""Every number the API accepts has a range (issue 53): each request model's numbers are bounded
on both sides, within int64 and finite (read from the models by ``core/ranges.py``, which also
writes docs/reference.md's table), and values out of range are refused naming the field and the
fix, through the real app."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from bench.reference_docs import REQUESTS
from unicron.control.coordinator import CoordinatorSettings
from unicron.control.service.service import create_app
from unicron.control.service.tokens import issue
from unicron.control.store.secret import load_or_create_secret
from unicron.core.access import Role
from unicron.core.ranges import number_ranges
from unicron.core.settings import Settings

INT64 = 2**63 - 1
TASK = '{"name": "t", "weight": 1, "run": {"program": ["p"], "iterations": 5%s}}'


@pytest.mark.parametrize("title, model", REQUESTS, ids=[m.__name__ for _, m in REQUESTS])
def test_every_number_of_every_request_is_bounded_and_finite(title: str, model: type) -> None:
    ranges = number_ranges(model)
    assert ranges, f"{title}: no numbers found (has the walker lost the model's fields?)"
    for r in ranges:
        assert r.low is not None and r.high is not None, f"{title} {r.path}: give it both bounds"
        if r.kind == "integer":
            assert r.low >= -INT64 and r.high <= INT64, f"{title} {r.path}: beyond int64"
        assert r.finite, f"{title} {r.path}: refuse NaN and infinities (allow_inf_nan=False)"


@pytest.fixture(scope="module")
def state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("numbers")


@pytest.fixture(scope="module")
def client(state: Path) -> Iterator[TestClient]:
    """One service for the module: every request below is refused, so none changes its state."""
    tmp_path, state = state, state / "state"
    admin = {"authorization": f"Bearer {issue(load_or_create_secret(state), Role.ADMIN, 'ops')}"}
    settings = CoordinatorSettings(state_dir=state, checkpoint_root=tmp_path / "ckpt")
    with TestClient(create_app(settings), headers=admin, raise_server_exceptions=False) as c:
        yield c


@pytest.mark.parametrize(
    "body, path, says",
    [
        (TASK.replace("5%s", "9223372036854775808%s") % "", "run.iterations", "less than or equal to"),
        (TASK.replace("5%s", "9007199254740993%s") % "", "run.iterations", "less than or equal to"),
        (
            TASK % ', "faults": [{"action": "stall", "rank": 0, "step": 1, "seconds": 1e308}]',
            "run.faults[0].seconds",
            "",
        ),
        (TASK.replace('"weight": 1', '"weight": NaN') % "", "weight", "finite"),
        (TASK.replace('"weight": 1', '"weight": 1e999') % "", "weight", "finite"),
        (TASK % ', "flops_per_sample": Infinity', "run.flops_per_sample", "finite"),
        (TASK.replace('"name": "t"', '"name": "t", "throughput": {"4": 1e31}') % "", "throughput.4", ""),
    ],
)
def test_out_of_range_numbers_in_a_task_are_refused_with_the_field_and_fix(
    client: TestClient, body: str, path: str, says: str
) -> None:
    answer = client.post("/v1/tasks", content=body, headers={"content-type": "application/json"})
    assert answer.status_code == 422, answer.text
    (problem,) = answer.json()["problems"]
    assert problem["path"] == path and says in problem["message"] and problem["fix"], problem
    assert client.get("/v1/tasks").json() == []


@pytest.mark.parametrize("duration", ["NaN", "1e999", "-1", "1e7"])
def test_out_of_range_numbers_in_a_heartbeat_are_refused(
    client: TestClient, state: Path, duration: str
) -> None:
    agent = {"authorization": f"Bearer {issue(load_or_create_secret(state / 'state'), Role.AGENT, 'n')}"}
    report = '{"type": "iteration", "task": "t", "generation": 1, "rank": 0, "step": 1, "samples": 1, '
    report += '"duration_s": %s}'
    body = '{"node": "n", "reports": [%s]}' % (report % duration)
    answer = client.post(
        "/v1/agents/heartbeat", content=body, headers={**agent, "content-type": "application/json"}
    )
    assert answer.status_code == 422, answer.text
    paths = [p["path"] for p in answer.json()["problems"]]
    assert paths == ["body.reports.0.iteration.duration_s"], paths
    assert all(p["fix"] for p in answer.json()["problems"])


@pytest.mark.parametrize("value", [float("inf"), float("nan"), 1e9, -1.0])
def test_a_settings_duration_out_of_range_is_refused_naming_it(value: float) -> None:
    """The coordinator's durations travel in orders and replies, whose ranges are bounded: a
    settings file cannot give one that every order would then be refused for."""
    with pytest.raises(ValidationError, match=r"stop_grace_s"):
        Settings(stop_grace_s=value, restart_stop_wait_s=value, failure_stop_grace_s=0.0)

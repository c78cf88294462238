"""Who may call what: every endpoint of the coordinator's OpenAPI schema, called with no token,
a forged one, and each role (the real app and store in process). The decision table itself
(core.access.decide) is checked by hand; the probe's findings (an anonymous submission, a
heartbeat forged for another node, another node's orders) are each closed here."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import jwt
import pytest
from fastapi.testclient import TestClient

from unicron.control.coordinator import CoordinatorSettings
from unicron.control.service.service import create_app
from unicron.control.service.tokens import issue, token_id, verify
from unicron.control.store.secret import load_or_create_secret, secret_path
from unicron.core.access import Need, Principal, Role, decide
from unicron.core.errors import UsageError
from unicron.core.settings import Settings

TASK = "name: t1\nweight: 1\nthroughput: {1: 1.0e9}\nrun: {program: [python, x.py], iterations: 5}\n"

# Every route and what it needs; the test below fails if the schema has a route not listed here.
NEEDS = {
    ("get", "/health"): Need.READ,
    ("get", "/openapi.json"): Need.READ,
    ("get", "/v1/tasks"): Need.READ,
    ("get", "/v1/tasks/{name}"): Need.READ,
    ("get", "/v1/tasks/{name}/logs"): Need.READ,  # as Kubernetes' view role reads pods' logs
    ("get", "/v1/nodes"): Need.READ,
    ("get", "/v1/workers"): Need.READ,
    ("get", "/v1/events"): Need.READ,
    ("get", "/v1/incidents"): Need.READ,
    ("get", "/v1/dashboard"): Need.READ,
    ("get", "/metrics"): Need.READ,  # Prometheus scrapes with a viewer token (not in the schema)
    ("post", "/v1/tasks"): Need.MANAGE,
    ("delete", "/v1/tasks/{name}"): Need.MANAGE,
    ("delete", "/v1/nodes/{name}"): Need.MANAGE,
    ("post", "/v1/nodes/{name}/drain"): Need.MANAGE,
    ("post", "/v1/nodes/{name}/resume"): Need.MANAGE,
    ("post", "/v1/tokens/revoked"): Need.MANAGE,
    ("post", "/v1/node-losses"): Need.MANAGE,
    ("get", "/v1/node-losses"): Need.READ,
    ("post", "/v1/agents/register"): Need.OWN_NODE,
    ("post", "/v1/agents/heartbeat"): Need.OWN_NODE,
    ("get", "/v1/agents/{node}/orders"): Need.OWN_NODE,
    ("post", "/v1/agents/{node}/logs"): Need.OWN_NODE,  # an answer to the coordinator's ReadLog
}
NODE = "node-a"
BODIES = {
    "/v1/tasks": {"content": TASK, "headers": {"content-type": "application/yaml"}},
    "/v1/agents/register": {"json": {"node": NODE, "slots": 2}},
    "/v1/agents/heartbeat": {"json": {"node": NODE}},
    "/v1/tokens/revoked": {"json": {"jti": "0" * 32}},
    "/v1/node-losses": {"json": {"held": False}},
    "/v1/agents/{node}/logs": {"json": {"request": "0" * 32}},
}


@pytest.fixture
def state(tmp_path: Path) -> Path:
    return tmp_path / "state"


@pytest.fixture
def app(state: Path, tmp_path: Path) -> Iterator[TestClient]:
    settings = CoordinatorSettings(state_dir=state, checkpoint_root=tmp_path / "ckpt")
    with TestClient(create_app(settings)) as client:
        yield client


def auth(state: Path, role: Role, subject: str) -> dict[str, str]:
    return {"authorization": f"Bearer {issue(load_or_create_secret(state), role, subject)}"}


def call(app: TestClient, method: str, path: str, headers: dict[str, str]) -> int:
    url = path.replace("{name}", "t1").replace("{node}", NODE)
    extra = BODIES.get(path, {}) if method == "post" else {}
    params = {"wait": 0} if path.endswith("/orders") else {}
    kwargs: dict[str, object] = {**extra, "params": params}
    given = {**headers, **kwargs.pop("headers", {})}  # type: ignore[dict-item]
    return app.request(method.upper(), url, headers=given, **kwargs).status_code  # type: ignore[arg-type]


def test_the_decision_table() -> None:
    admin, viewer = Principal(Role.ADMIN, "ops"), Principal(Role.VIEWER, "dash")
    agent = Principal(Role.AGENT, NODE)
    assert [decide(None, need).status for need in Need] == [401, 401, 401]
    assert [decide(admin, need, NODE).status for need in Need] == [200, 200, 403]
    assert [decide(viewer, need, NODE).status for need in Need] == [200, 403, 403]
    assert [decide(agent, need, NODE).status for need in Need] == [403, 403, 200]
    other = decide(agent, Need.OWN_NODE, "node-b")
    assert other.status == 403 and "--subject node-b" in other.why


def test_the_dashboard_page_needs_no_token_and_holds_no_data(app: TestClient, state: Path) -> None:
    """The page and its files are the same for everyone (its data comes from /v1/dashboard, with
    the token it is given); nothing else is served from the package's folder."""
    app.post(
        "/v1/tasks",
        content=TASK,
        headers={"content-type": "application/yaml", **auth(state, Role.ADMIN, "a")},
    )
    page = app.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "t1" not in page.text  # no task, node or event in it: the script asks for them
    for name in ("dashboard.js", "dashboard.css", "uPlot.iife.min.js", "uPlot.min.css"):
        assert app.get(f"/ui/{name}").status_code == 200, name
    for name in ("index.html", "uPlot.LICENSE", "..%2F..%2Fservice.py", "secret"):
        assert app.get(f"/ui/{name}").status_code == 404, name


def test_every_endpoint_with_no_token_a_forged_one_and_each_role(app: TestClient, state: Path) -> None:
    schema = app.get("/openapi.json", headers=auth(state, Role.VIEWER, "v")).json()
    routes = {(m, p) for p, ops in schema["paths"].items() for m in ops}
    routes |= {("get", "/openapi.json"), ("get", "/metrics")}
    assert routes == set(NEEDS), "a route without an entry in NEEDS: say who may call it"
    forged = issue(b"0" * 64, Role.ADMIN, "mallory")  # signed with a secret that is not the cluster's
    callers: dict[str, tuple[Principal | None, dict[str, str]]] = {
        "anonymous": (None, {}),
        "forged": (None, {"authorization": f"Bearer {forged}"}),
        "garbage": (None, {"authorization": "Bearer not-a-token"}),
    }
    for role, subject in (
        (Role.VIEWER, "dash"),
        (Role.AGENT, NODE),
        (Role.AGENT, "node-b"),
        (Role.ADMIN, "ops"),
    ):
        callers[f"{role.value}:{subject}"] = (Principal(role, subject), auth(state, role, subject))
    for (method, path), need in sorted(NEEDS.items(), key=lambda kv: kv[0][0] != "post"):
        for who, (principal, headers) in callers.items():
            status = call(app, method, path, headers)
            verdict = decide(principal, need, NODE)
            if verdict.allowed:
                assert status not in (401, 403), (method, path, who, status)
            else:
                assert status == verdict.status, (method, path, who, status)


def test_anonymous_and_viewer_calls_change_nothing(app: TestClient, state: Path) -> None:
    viewer = auth(state, Role.VIEWER, "dash")
    assert app.post("/v1/tasks", content=TASK).status_code == 401
    assert app.post("/v1/tasks", content=TASK, headers=viewer).status_code == 403
    assert app.get("/v1/tasks", headers=viewer).json() == []  # the probe's `sh -c id` never queued
    admin = auth(state, Role.ADMIN, "ops")
    assert app.post("/v1/tasks", content=TASK, headers=admin).status_code == 201
    assert app.delete("/v1/tasks/t1", headers=viewer).status_code == 403
    assert app.get("/v1/tasks/t1", headers=viewer).json()["state"] == "waiting"


def test_an_agent_cannot_speak_for_another_node(app: TestClient, state: Path) -> None:
    mine, other = auth(state, Role.AGENT, NODE), auth(state, Role.AGENT, "node-b")
    assert app.post("/v1/agents/register", json={"node": NODE, "slots": 2}, headers=mine).status_code == 200
    seen = app.get("/v1/nodes", headers=auth(state, Role.VIEWER, "v")).json()[0]["seconds_since_heartbeat"]
    # The probe's forged heartbeat: node-b's agent reports node-a's workers gone and a failure.
    report = {"type": "exception", "task": "t1", "generation": 1, "rank": 0, "step": 3}
    report |= {"error_type": "RuntimeError", "message": "forged"}
    forged = app.post("/v1/agents/heartbeat", json={"node": NODE, "reports": [report]}, headers=other)
    assert forged.status_code == 403 and "for node 'node-b', not 'node-a'" in forged.json()["error"]
    assert app.get(f"/v1/agents/{NODE}/orders", params={"wait": 0}, headers=other).status_code == 403
    assert app.post("/v1/agents/register", json={"node": NODE, "slots": 1}, headers=other).status_code == 403
    after = app.get("/v1/nodes", headers=auth(state, Role.VIEWER, "v")).json()
    assert [(n["name"], n["slots"], n["state"]) for n in after] == [(NODE, 2, "healthy")]
    assert after[0]["seconds_since_heartbeat"] >= seen  # the forged beat did not count as one
    kinds = {e["kind"] for e in app.get("/v1/events", headers=auth(state, Role.VIEWER, "v")).json()}
    assert "report_rejected" not in kinds and "incident" not in kinds


def test_tokens_expire_and_cannot_be_altered(state: Path) -> None:
    secret = load_or_create_secret(state)
    assert verify(secret, issue(secret, Role.VIEWER, "v", ttl_s=60)) == Principal(Role.VIEWER, "v")
    expired = jwt.encode(
        {"role": "admin", "sub": "x", "exp": int(time.time()) - 5}, secret, algorithm="HS256"
    )
    assert verify(secret, expired) is None
    header, _, signature = issue(secret, Role.VIEWER, "v").split(".")
    promoted = jwt.utils.base64url_encode(b'{"role":"admin","sub":"v"}').decode()
    assert verify(secret, f"{header}.{promoted}.{signature}") is None
    unsigned = jwt.encode({"role": "admin", "sub": "x"}, None, algorithm="none")  # type: ignore[arg-type]
    assert verify(secret, unsigned) is None
    with pytest.raises(UsageError, match="not a valid name"):
        issue(secret, Role.AGENT, "../etc")


def test_the_secret_is_private_and_token_create_issues_working_tokens(
    app: TestClient, state: Path, tmp_path: Path
) -> None:
    assert stat.S_IMODE(secret_path(state).stat().st_mode) == 0o600
    out = tmp_path / "viewer.token"
    cli = [sys.executable, "-m", "unicron.cli.main", "token", "create", "--state-dir", str(state)]
    made = subprocess.run([*cli, "--role", "viewer", "--output", str(out)], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    token = out.read_text().strip()
    assert app.get("/v1/tasks", headers={"authorization": f"Bearer {token}"}).status_code == 200
    no_node = subprocess.run([*cli, "--role", "agent"], capture_output=True, text=True)
    assert no_node.returncode == 2 and "--subject <node name>" in no_node.stderr
    os.chmod(secret_path(state), 0o644)
    exposed = subprocess.run([*cli, "--role", "admin"], capture_output=True, text=True)
    assert exposed.returncode == 2 and f"chmod 600 {secret_path(state)}" in exposed.stderr


def test_an_admin_removes_a_lost_stale_registration_that_locked_real_agents_out(tmp_path: Path) -> None:
    # The probe's lockout: a node registered with 1 slot made every real 2-slot agent a conflict
    # (its token now has to be that node's; still, a stale or mistaken registration must go).
    state = tmp_path / "state"
    limits = Settings(heartbeat_interval_s=0.1, heartbeat_deadline_s=0.5)
    settings = CoordinatorSettings(state_dir=state, checkpoint_root=tmp_path / "ckpt", limits=limits)
    admin, viewer = auth(state, Role.ADMIN, "ops"), auth(state, Role.VIEWER, "v")
    with TestClient(create_app(settings)) as app:
        stale = {"node": "stale", "slots": 1}
        assert (
            app.post("/v1/agents/register", json=stale, headers=auth(state, Role.AGENT, "stale")).status_code
            == 200
        )
        real = {"node": "real", "slots": 2}
        real_agent = auth(state, Role.AGENT, "real")
        assert app.post("/v1/agents/register", json=real, headers=real_agent).status_code == 409
        early = app.delete("/v1/nodes/stale", headers=admin)
        assert early.status_code == 409 and "stop its agent first" in early.json()["error"]
        assert app.delete("/v1/nodes/stale", headers=viewer).status_code == 403
        deadline = time.time() + 20
        while app.get("/v1/nodes", headers=viewer).json()[0]["state"] != "lost" and time.time() < deadline:
            time.sleep(0.1)
        assert app.delete("/v1/nodes/stale", headers=admin).json() == {"removed": "stale"}
        assert app.delete("/v1/nodes/stale", headers=admin).status_code == 404
        assert app.post("/v1/agents/register", json=real, headers=real_agent).status_code == 200
        assert [n["name"] for n in app.get("/v1/nodes", headers=viewer).json()] == ["real"]


def test_a_token_revoked_through_the_api_stays_refused_by_the_next_coordinator(
    state: Path, tmp_path: Path
) -> None:
    """With several coordinators the revocation list cannot be one host's file: the leader
    keeps the id in the store, and a coordinator that starts on that store refuses it too."""
    settings = CoordinatorSettings(state_dir=state, checkpoint_root=tmp_path / "ckpt")
    secret = load_or_create_secret(state)
    leaked = issue(secret, Role.VIEWER, "leaked")
    viewer, admin = {"authorization": f"Bearer {leaked}"}, auth(state, Role.ADMIN, "ops")
    with TestClient(create_app(settings)) as app:
        assert app.get("/v1/tasks", headers=viewer).status_code == 200
        jti = token_id(secret, leaked)["jti"]
        assert app.post("/v1/tokens/revoked", json={"jti": "nope"}, headers=admin).status_code == 422
        assert app.post("/v1/tokens/revoked", json={"jti": jti}, headers=viewer).status_code == 403
        assert app.post("/v1/tokens/revoked", json={"jti": jti}, headers=admin).json() == {"revoked": jti}
        assert app.get("/v1/tasks", headers=viewer).status_code == 401
        assert app.get("/v1/tasks", headers=auth(state, Role.VIEWER, "other")).status_code == 200
    assert not (state / "revoked-tokens").exists()  # in the store, not in this host's file
    with TestClient(create_app(settings)) as successor:
        assert successor.get("/v1/tasks", headers=viewer).status_code == 401


def test_an_admin_holds_node_losses_and_the_next_coordinator_too(state: Path, tmp_path: Path) -> None:
    """A planned change of the network: no silent node is declared lost until released."""
    settings = CoordinatorSettings(state_dir=state, checkpoint_root=tmp_path / "ckpt")
    admin = auth(state, Role.ADMIN, "ops")
    with TestClient(create_app(settings)) as app:
        held = app.post("/v1/node-losses", json={"held": True, "reason": "switch upgrade"}, headers=admin)
        assert held.json() == {"held": True}
        assert app.post("/v1/node-losses", json={"held": "maybe"}, headers=admin).status_code == 422
    with TestClient(create_app(settings)) as successor:
        hold = successor.get("/v1/node-losses", headers=auth(state, Role.VIEWER, "v")).json()
        assert hold["held"] and hold["reason"] == "switch upgrade"
        # In force at the successor (not only kept), and shown: the gauge, `unicron status`.
        assert hold["now"] == {"by_hand": True, "alarm": None, "domains": [], "nodes": 0}
        assert "unicron_node_losses_held_by_hand 1.0" in successor.get("/metrics", headers=admin).text
        released = successor.post("/v1/node-losses", json={"held": False}, headers=admin)
        assert released.json() == {"held": False}
        assert not successor.get("/v1/node-losses", headers=admin).json()["held"]
        kinds = [e["kind"] for e in successor.get("/v1/events", headers=admin).json()]
        assert kinds.count("node_losses_held") == 1 and kinds.count("node_losses_released") == 1

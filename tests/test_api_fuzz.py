"""Fuzz the coordinator's API against its own OpenAPI schema (schemathesis): the real service on
a loopback port, every operation, a bounded number of generated requests each (valid and
invalid ones). No answer may be a server error or stray from the schema: the status code, the
content type and the body's shape are each declared (the probe found 7 server errors and 12
schema violations in 2,529 cases before the fixes). Agent routes are called with a token for the
node the request names (when that is a valid name), so that generated reports and heartbeats
reach the coordinator instead of stopping at the token check."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
import uvicorn
from hypothesis import HealthCheck, given, settings

from unicron.control.coordinator import CoordinatorSettings
from unicron.control.launch.localcluster import free_port
from unicron.control.service.service import create_app
from unicron.control.service.tokens import issue
from unicron.control.store.secret import load_or_create_secret
from unicron.core.access import Role
from unicron.core.errors import UsageError

# Per operation. Derandomized: make test sees the same ~1,700 requests every run (a fuzzer's luck
# must not decide CI); UNICRON_FUZZ_EXAMPLES=N with UNICRON_FUZZ_RANDOM=1 searches further.
EXAMPLES = int(os.environ.get("UNICRON_FUZZ_EXAMPLES", "150"))
RANDOM = os.environ.get("UNICRON_FUZZ_RANDOM") == "1"


class Served:
    def __init__(self, url: str, secret: bytes) -> None:
        self.url, self.secret = url, secret
        self.admin = {"Authorization": f"Bearer {issue(secret, Role.ADMIN, 'fuzzer')}"}

    def headers_for(self, case: schemathesis.Case) -> dict[str, str]:
        """An agent token for the node the case names, else the admin's."""
        if not case.path.startswith("/v1/agents"):
            return self.admin
        body: Any = case.body
        node = (case.path_parameters or {}).get("node") or (
            body.get("node") if isinstance(body, dict) else None
        )
        try:
            return {"Authorization": f"Bearer {issue(self.secret, Role.AGENT, str(node))}"}
        except UsageError:  # not a name a token can be issued for: the admin's (403) it is
            return self.admin


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root: Path = tmp_path_factory.mktemp("fuzz")
    app = create_app(CoordinatorSettings(state_dir=root / "state", checkpoint_root=root / "ckpt"))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.started and time.time() < deadline:
        time.sleep(0.05)
    assert server.started, "the coordinator did not start"
    yield Served(f"http://127.0.0.1:{port}", load_or_create_secret(root / "state"))
    server.should_exit = True
    thread.join(10)


def excluded(case: schemathesis.Case) -> list[Any]:
    """A submission's body is YAML text or a JSON object: a task spec's rules (a known GPU, heads
    dividing the width, a program to run) are more than a schema can say, so a schema-valid body
    may rightly be refused; every other check still holds for it."""
    submit = case.method.upper() == "POST" and case.path == "/v1/tasks"
    return [schemathesis.checks.positive_data_acceptance] if submit else []


# What each answer is checked for beyond its status: its declared status, content type, headers
# and body schema (every error's included: ``{"error": ...}``). Each is on by default; checked
# here so that a configuration that turned one off would fail rather than pass quietly.
CONFORMANCE = [
    schemathesis.checks.not_a_server_error,
    schemathesis.checks.status_code_conformance,
    schemathesis.checks.content_type_conformance,
    schemathesis.checks.response_headers_conformance,
    schemathesis.checks.response_schema_conformance,
]


def test_no_server_error_and_no_answer_outside_the_schema(served: Served) -> None:
    api = schemathesis.openapi.from_url(f"{served.url}/openapi.json", headers=served.admin)
    operations = [result.ok() for result in api.get_all_operations()]
    assert len(operations) >= 11  # every route (the schema itself is served outside it)
    for operation in operations:
        checks = api.config.checks_config_for(operation=operation, phase=None)
        assert all(checks.get_by_name(name=check.__name__).enabled for check in CONFORMANCE)
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=not RANDOM,
        )
        def fuzz(case: schemathesis.Case) -> None:
            if case.path.endswith("/orders"):
                case.query = {**(case.query or {}), "wait": 0}  # a long poll would only add waiting
            # In the case (not the call) so that schemathesis' ignored-auth check can take it away.
            case.headers = {**(case.headers or {}), **served.headers_for(case)}
            case.call_and_validate(base_url=served.url, excluded_checks=excluded(case))

        fuzz()


def test_the_coordinator_survived_the_fuzzing(served: Served) -> None:
    assert httpx.get(f"{served.url}/health", headers=served.admin).json() == {"status": "ok"}

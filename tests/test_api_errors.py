"""Every error the coordinator's API answers has one shape, ``{"error": ...}`` (with ``problems``
for a bad spec or request), as docs/security.md says: Starlette's and FastAPI's own refusals too
(a body that is not UTF-8 JSON, no such route, a method the route does not take), and a 405 names
in ``Allow`` every method the path takes (issue 53 point 4). The real app, in process."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from fastapi.testclient import TestClient

from unicron.control.coordinator import CoordinatorSettings
from unicron.control.service.service import create_app
from unicron.control.service.tokens import issue
from unicron.control.store.secret import load_or_create_secret
from unicron.core.access import Role


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    root = tmp_path_factory.mktemp("errors")
    admin = {"authorization": f"Bearer {issue(load_or_create_secret(root / 'state'), Role.ADMIN, 'ops')}"}
    settings = CoordinatorSettings(state_dir=root / "state", checkpoint_root=root / "ckpt")
    with TestClient(create_app(settings), headers=admin, raise_server_exceptions=False) as c:
        yield c


def error_of(answer: httpx.Response, status: int) -> str:
    assert answer.status_code == status, answer.text
    assert answer.headers["content-type"] == "application/json"
    body = answer.json()
    assert set(body) <= {"error", "problems"} and isinstance(body["error"], str), body
    return str(body["error"])


@pytest.mark.parametrize("path", ["/v1/tokens/revoked", "/v1/nodes/n0/drain"])
def test_a_body_that_is_not_utf8_json_is_refused_in_the_one_shape(client: TestClient, path: str) -> None:
    answer = client.post(path, content=b'{"jti": "\xff\xfe"}', headers={"content-type": "application/json"})
    assert "could not be read as JSON (UTF-8)" in error_of(answer, 400)
    garbage = client.post(path, content=b"{not json", headers={"content-type": "application/json"})
    assert error_of(garbage, 422) == "invalid request"


def test_no_such_route_is_refused_in_the_one_shape(client: TestClient) -> None:
    assert "no route GET /v1/nothing" in error_of(client.get("/v1/nothing"), 404)


def test_a_405_names_every_method_of_its_path(client: TestClient) -> None:
    """For every path of the OpenAPI schema, OPTIONS and PATCH (which no route takes) get a 405
    whose Allow header lists exactly the methods the schema gives that path."""
    paths = client.get("/openapi.json").json()["paths"]
    assert len(paths) >= 11
    for template, operations in paths.items():
        path = template.replace("{name}", "n0").replace("{node}", "n0")
        declared = sorted(method.upper() for method in operations)
        for method in ("OPTIONS", "PATCH"):
            answer = client.request(method, path)
            assert f"{method} is not a method of {path}" in error_of(answer, 405)
            assert answer.headers["allow"] == ", ".join(declared), (path, answer.headers["allow"])

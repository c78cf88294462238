"""Bearer-token checks for the coordinator's routes (the decision is core.access.decide).

Every route depends on one of these: ``reader`` and ``manager`` for users' calls, ``agent``
for the agent channel, whose routes then call ``own_node`` with the node the request speaks
for. The scheme is declared in the OpenAPI schema, so clients and fuzzers see it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from fastapi import Depends
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from unicron.control.revocation import Revocations
from unicron.control.tokens import verify
from unicron.core.access import Need, Principal, decide
from unicron.core.errors import Forbidden, Unauthenticated

_bearer = HTTPBearer(
    auto_error=False, description="a token from `unicron token create --role admin|agent|viewer`"
)
Bearer = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def enforce(principal: Principal | None, need: Need, node: str | None = None) -> None:
    verdict = decide(principal, need, node)
    if not verdict.allowed:
        raise (Unauthenticated if verdict.status == 401 else Forbidden)(verdict.why)


class Guard:
    def __init__(self, secret: bytes, revocations: Revocations) -> None:
        self.secret, self.revocations = secret, revocations

    def principal(self, credentials: HTTPAuthorizationCredentials | None) -> Principal | None:
        if credentials is None:
            return None
        return verify(self.secret, credentials.credentials, self.revocations.ids())

    def needing(self, need: Need) -> Callable[[HTTPAuthorizationCredentials | None], Principal]:
        """A route dependency that lets through only callers who may do ``need`` (READ or
        MANAGE), and gives the route their principal."""

        def check(credentials: Bearer) -> Principal:
            principal = self.principal(credentials)
            enforce(principal, need)
            assert principal is not None
            return principal

        return check

    def agent(self, credentials: Bearer) -> Principal:
        """A route dependency for the agent channel: an agent token, for a node the route then
        checks with ``own_node``."""
        principal = self.principal(credentials)
        enforce(principal, Need.OWN_NODE, principal.subject if principal else None)
        assert principal is not None
        return principal


def own_node(principal: Principal, node: str) -> None:
    """Refuse an agent speaking for a node its token was not issued for."""
    enforce(principal, Need.OWN_NODE, node)

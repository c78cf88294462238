"""Bearer-token checks for the coordinator's routes (the decision is core.access.decide).

Every route depends on one of these: ``reader`` and ``manager`` for users' calls, ``agent``
for the agent channel, whose routes then call ``own_node`` with the node the request speaks
for. The scheme is declared in the OpenAPI schema, so clients and fuzzers see it.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Depends
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from unicron.control.service.revocation import Revocations
from unicron.control.service.tokens import Verified, verified
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
    """Checks tokens. A token's signature is checked once and its claims kept (up to
    ``CACHE_SIZE`` tokens; a cluster's agents send the same token twice a second each, and the
    check is most of a heartbeat's cost); its expiry and revocation are checked on every call."""

    CACHE_SIZE = 16_384

    def __init__(
        self,
        secret: bytes,
        revocations: Revocations,
        clock: Callable[[], float] = time.time,
        also_revoked: Callable[[], frozenset[str]] = frozenset,
    ) -> None:
        """``also_revoked``: the ids revoked through the API (kept in the store)."""
        self.secret, self.revocations, self.clock = secret, revocations, clock
        self.also_revoked = also_revoked
        self._checked: dict[str, Verified] = {}

    def token(self, token: str) -> Principal | None:
        """The principal a bearer token names, if it is valid now."""
        found = self._checked.get(token)
        if found is None:
            found = verified(self.secret, token)
            if found is None:
                return None  # a bad token is not kept: a flood of them must not fill the cache
            if len(self._checked) >= self.CACHE_SIZE:
                self._checked.clear()
            self._checked[token] = found
        if found.expires is not None and self.clock() >= found.expires:
            return None
        revoked = found.jti in self.revocations.ids() or found.jti in self.also_revoked()
        return None if revoked else found.principal

    def principal(self, credentials: HTTPAuthorizationCredentials | None) -> Principal | None:
        return None if credentials is None else self.token(credentials.credentials)

    def needing(self, need: Need) -> Callable[[HTTPAuthorizationCredentials | None], Awaitable[Principal]]:
        """A route dependency that lets through only callers who may do ``need`` (READ or
        MANAGE), and gives the route their principal. Async, as the others: FastAPI runs a
        plain function in a thread, which for a check this small costs more than the check."""

        async def check(credentials: Bearer) -> Principal:
            principal = self.principal(credentials)
            enforce(principal, need)
            assert principal is not None
            return principal

        return check

    async def agent(self, credentials: Bearer) -> Principal:
        """A route dependency for the agent channel: an agent token, for a node the route then
        checks with ``own_node``."""
        principal = self.principal(credentials)
        enforce(principal, Need.OWN_NODE, principal.subject if principal else None)
        assert principal is not None
        return principal


def own_node(principal: Principal, node: str) -> None:
    """Refuse an agent speaking for a node its token was not issued for."""
    enforce(principal, Need.OWN_NODE, node)

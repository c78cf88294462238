"""Who may call what on the coordinator: roles, the principal a token names, and the decision.

Three roles, as a cluster's operators split the work:

- ``admin``: submits and cancels tasks (which runs programs on every node), and reads;
- ``agent``: registers, heartbeats, reports and takes launch orders, **for its own node only**
  (a token names the node it was issued for); it reads nothing else;
- ``viewer``: reads (tasks, nodes, workers, events, health, the API schema, workers' logs:
  as Kubernetes' view role reads pods' logs).

The decision is a pure function of the principal and what the call needs, so that every route
asks the same question and the table of who-may-do-what is tested without a server.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from unicron.core.errors import UsageError

TOKEN_ID = re.compile(r"^[0-9a-f]{32}$")  # a token's id, its jti (control/service/tokens.py: uuid4().hex)


def check_token_id(jti: str) -> None:
    if not TOKEN_ID.match(jti):
        raise UsageError(f"--id {jti!r} is not a token id (32 hex digits, as `token create` prints)")


class Role(enum.StrEnum):
    ADMIN = "admin"
    AGENT = "agent"
    VIEWER = "viewer"


class Need(enum.Enum):
    """What a route needs from its caller."""

    READ = "read"  # the cluster's state
    MANAGE = "manage"  # submit or cancel tasks
    OWN_NODE = "own-node"  # act as one node's agent


@dataclass(frozen=True)
class Principal:
    """The caller a valid token names: its role and subject (a person's or service's name; for
    an agent, the node it may speak for)."""

    role: Role
    subject: str


@dataclass(frozen=True)
class Verdict:
    """Allowed, or the HTTP status (401: who are you; 403: not you) and why."""

    allowed: bool
    status: int
    why: str


ALLOW = Verdict(True, 200, "")
MAY = {
    Need.READ: frozenset({Role.ADMIN, Role.VIEWER}),
    Need.MANAGE: frozenset({Role.ADMIN}),
    Need.OWN_NODE: frozenset({Role.AGENT}),
}


def decide(principal: Principal | None, need: Need, node: str | None = None) -> Verdict:
    """May ``principal`` do what ``need`` says (as the agent of ``node`` for ``OWN_NODE``)?"""
    if principal is None:
        return Verdict(
            False,
            401,
            "no valid bearer token: send 'Authorization: Bearer <token>' with a token from "
            "`unicron token create` (the CLI reads --token-file, UNICRON_TOKEN_FILE or UNICRON_TOKEN)",
        )
    allowed = MAY[need]
    if principal.role not in allowed:
        roles = " or ".join(sorted(r.value for r in allowed))
        return Verdict(
            False, 403, f"a {principal.role.value} token cannot {need.value}: this needs a {roles} token"
        )
    if need is Need.OWN_NODE and principal.subject != node:
        return Verdict(
            False,
            403,
            f"this agent token is for node {principal.subject!r}, not {node!r}: "
            f"issue one with `unicron token create --role agent --subject {node}`",
        )
    return ALLOW

"""Errors that users see. Each one names where the problem is and how to fix it."""

from __future__ import annotations

from dataclasses import dataclass, field


class UnicronError(Exception):
    """Base class for errors shown to users as a message, never as a traceback."""


@dataclass(frozen=True)
class SpecProblem:
    """One problem in a spec: the field path (``tasks[2].weight``), what is wrong, the fix."""

    path: str
    message: str
    fix: str

    def render(self) -> str:
        where = self.path or "(top level)"
        return f"{where}: {self.message}; fix: {self.fix}"


@dataclass
class SpecError(UnicronError):
    """An invalid spec (a cluster or task file, an API payload, a trace)."""

    source: str
    problems: list[SpecProblem] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__init__(str(self))

    def __str__(self) -> str:
        lines = [f"{self.source}: invalid spec ({len(self.problems)} problem(s))"]
        lines += [f"  {p.render()}" for p in self.problems]
        return "\n".join(lines)


class UsageError(UnicronError):
    """A malformed request on the command line or the API (an unknown event, a bad flag)."""


class NotFound(UsageError):
    """A request names something that does not exist (HTTP 404)."""


class Conflict(UsageError):
    """A request conflicts with the current state (HTTP 409): a task already ended, a node whose
    slots differ from the cluster's."""


class Unauthenticated(UnicronError):
    """A call without a valid bearer token (HTTP 401)."""


class Forbidden(UnicronError):
    """A call whose token's role or node may not do this (HTTP 403)."""


class Unavailable(UnicronError):
    """What a request needs cannot answer now (HTTP 503): the node holding a worker's log is
    lost, or its agent did not answer in time."""

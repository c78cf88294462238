"""Cluster events the planner answers: a node lost or back, tasks arriving, a task finishing."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from unicron.core.errors import UsageError


@dataclass(frozen=True)
class NodeLost:
    """A node out of service: lost, isolated, or (``drained``) taken out by an admin. The plan
    is the same; what it says of the tasks there differs (a drain loses them nothing)."""

    node: int
    drained: bool = False

    def __str__(self) -> str:
        return f"node-drained:{self.node}" if self.drained else f"node-lost:{self.node}"


@dataclass(frozen=True)
class NodeBack:
    """One node (re)joins. Which one does not change the plan, only where workers go; without
    a node id the longest-down node (or a new one) is meant."""

    node: int | None = None

    def __str__(self) -> str:
        return "node-back" if self.node is None else f"node-back:{self.node}"


@dataclass(frozen=True)
class TaskDone:
    task: str

    def __str__(self) -> str:
        return f"task-done:{self.task}"


@dataclass(frozen=True)
class TasksArrived:
    """One submission (one task, or several submitted together) joins the cluster's tasks.

    The coordinator queues a submission until a plan table that includes it is built, so that
    its arrival, too, is answered by a lookup."""

    tasks: tuple[str, ...]

    def __str__(self) -> str:
        return f"task-arrived:{','.join(self.tasks)}"


PlanEvent = NodeLost | NodeBack | TaskDone | TasksArrived


def named(event: PlanEvent, names: Mapping[int, str]) -> str:
    """The event as a live cluster's events and pages show it: a node by its name. The planner
    numbers nodes in the order their agents registered, so its id (``node-lost:3``) says
    nothing about which node it was; an id with no name stays as it is."""
    if isinstance(event, NodeLost | NodeBack) and event.node is not None and event.node in names:
        return f"{str(event).split(':')[0]}:{names[event.node]}"
    return str(event)


def listed(texts: Sequence[str], shown: int = 6) -> str:
    """Events as a plan's record names them: the first ``shown``, then how many more (a mass
    loss answered by one solve names a handful, not thousands)."""
    more = len(texts) - shown
    return ", ".join(texts[:shown]) + (f" and {more} more" if more > 0 else "")


EVENT_FORMS = "node-lost:N, node-back[:N], task-done:NAME"


def parse_event(text: str) -> PlanEvent:
    """Parse the command-line form of an event; a bad one is a UsageError naming the forms."""
    kind, _, arg = text.strip().partition(":")
    if kind == "node-lost" and arg.strip().isdigit():
        return NodeLost(int(arg))
    if kind == "node-back" and not arg:
        return NodeBack()
    if kind == "node-back" and arg.strip().isdigit():
        return NodeBack(int(arg))
    if kind == "task-done" and arg.strip():
        return TaskDone(arg.strip())
    raise UsageError(f"unknown event {text!r}: use one of {EVENT_FORMS}")

"""The cluster events the actuator carried out, in order: what the planner answers.

A node leaves service (lost, isolated, drained) or comes back, a task ends, a submission is
admitted: each is noted here by the code that made it so (:class:`~unicron.control.act.effects.
Applier`, the one writer of the store), numbered, as the event the plan table is keyed by
(``core/events.py``). The planner front (``place/allocator.py``) answers the events since the
state its table was built for, as told: it never guesses them back from the state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from unicron.core.events import NodeBack, NodeLost, PlanEvent, TaskDone, TasksArrived
from unicron.core.states import NodeState

# Events are kept while a table may still be answered with them; a burst larger than this between
# two plans is solved on the spot anyway ("N events at once"), so older ones need not be kept.
KEEP_EVENTS = 4096


@dataclass
class Happened:
    """Numbered cluster events (the first is number 1; ``last`` is the newest's, 0: none)."""

    last: int = 0
    _events: list[tuple[int, PlanEvent]] = field(default_factory=list)

    def note(self, event: PlanEvent) -> None:
        self.last += 1
        self._events.append((self.last, event))
        if len(self._events) > 2 * KEEP_EVENTS:
            del self._events[:KEEP_EVENTS]

    def node_moved(self, node_id: int, was: NodeState | None, to: NodeState) -> None:
        """A node's state changed (``was`` None: it registered anew): in service is healthy."""
        healthy_before, healthy_now = was is NodeState.HEALTHY, to is NodeState.HEALTHY
        if healthy_before and not healthy_now:
            self.note(NodeLost(node_id, drained=to is NodeState.DRAINING))
        elif healthy_now and not healthy_before:
            self.note(NodeBack(node_id))

    def since(self, number: int) -> tuple[PlanEvent, ...] | None:
        """The events after ``number``; None when some of them are no longer kept."""
        if number < self.last - len(self._events):
            return None
        return tuple(e for n, e in self._events if n > number)


def net(events: Sequence[PlanEvent]) -> tuple[PlanEvent, ...]:
    """What ``events`` change, in order: a node lost and back (or back and lost) before any plan
    changed nothing, nor did a submission whose every task ended before it was planned; an event
    told twice counts once."""
    left: list[PlanEvent] = []
    for event in events:
        undone = _undoes(event, left)
        if undone is not None:
            left.remove(undone)
        elif event not in left:
            left.append(event)
    # A submission's tasks that all ended before the plan: neither its arrival nor their ends.
    for arrival in [e for e in left if isinstance(e, TasksArrived)]:
        after = left[left.index(arrival) + 1 :]
        ends = [TaskDone(name) for name in arrival.tasks]
        if all(end in after for end in ends):
            left = [e for e in left if e != arrival and e not in ends]
    return tuple(left)


def _undoes(event: PlanEvent, earlier: list[PlanEvent]) -> PlanEvent | None:
    """The earlier event that ``event`` takes back (a node's loss by its return, or its return by
    its loss), if any."""
    if isinstance(event, NodeBack) and event.node is not None:
        return next((e for e in earlier if isinstance(e, NodeLost) and e.node == event.node), None)
    if isinstance(event, NodeLost):
        return next((e for e in earlier if isinstance(e, NodeBack) and e.node == event.node), None)
    return None

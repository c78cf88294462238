"""The cluster events the actuator carried out, in order: what the planner answers.

A node leaves service (lost, isolated, drained) or comes back, a task ends: each is noted here by
the code that made it so (:class:`~unicron.control.act.effects.Applier`, the one writer of the
store), numbered, as the event the plan table is keyed by (``core/events.py``); a submission, by
the placer when it queues it for the table that holds its arrival. The planner front
(``place/allocator.py``) answers the events since the state its table was built for, as told: it
never guesses them back from the state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from unicron.core.events import NodeBack, NodeLost, PlanEvent, TaskDone, TasksArrived
from unicron.core.states import NodeState

# Events are kept while a table may still be answered with them; a burst larger than this between
# two plans is solved anyway ("N events at once"), so older ones need not be kept.
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
        first = self.last - len(self._events) + 1  # the oldest kept event's number
        if number + 1 < first:
            return None
        return tuple(e for _, e in self._events[max(0, number + 1 - first) :])


def net(events: Sequence[PlanEvent]) -> tuple[PlanEvent, ...]:
    """What ``events`` change, in order, in one pass: a node lost and back (or back and lost)
    before any plan changed nothing, nor did a submission whose every task ended after it and
    before it was planned; a node's loss or return told twice counts once, as does a submission
    told again with more of the queue (the later one, which holds it, stands)."""
    left: dict[int, PlanEvent] = {}  # position in ``events`` -> an event that still stands
    node_at: dict[int, int] = {}  # node id -> the position of its standing loss or return
    arrival_of: dict[str, int] = {}  # task -> the position of the standing arrival that brought it
    ends_of: dict[int, list[int]] = {}  # an arrival's position -> the positions of its tasks' ends
    for at, event in enumerate(events):
        if isinstance(event, NodeLost | NodeBack) and event.node is not None:
            earlier = node_at.pop(event.node, None)
            if earlier is None:
                node_at[event.node], left[at] = at, event
            elif type(left[earlier]) is type(event):
                node_at[event.node] = earlier  # told twice
            else:
                del left[earlier]  # undone
        elif isinstance(event, TasksArrived):
            superseded = {arrival_of[name] for name in event.tasks if name in arrival_of}
            left[at], ends_of[at] = event, [end for old in sorted(superseded) for end in ends_of.pop(old)]
            for old in superseded:
                del left[old]
            ended = {e.task for i in ends_of[at] if isinstance(e := events[i], TaskDone)}
            arrival_of.update({name: at for name in event.tasks if name not in ended})
        elif isinstance(event, TaskDone) and event.task in arrival_of:
            arrival = arrival_of.pop(event.task)
            left[at] = event
            ends_of[arrival].append(at)
            brought = left[arrival]
            if isinstance(brought, TasksArrived) and len(ends_of[arrival]) == len(brought.tasks):
                for gone in (arrival, *ends_of.pop(arrival)):  # came and went before any plan
                    del left[gone]
        else:
            left[at] = event
    return tuple(left.values())

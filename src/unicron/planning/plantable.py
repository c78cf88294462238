"""Plans computed ahead for the likely next events, so an event is answered by a lookup.

The table holds a plan for: each node lost (nodes whose loss hits the same tasks by the same
amounts share one plan), one node back, each task finishing and each queued submission arriving.
It is built from a state and is rebuilt after every event from the state that event leads to
(:func:`refresh`), and whenever its inputs change (a submission, new throughput measurements).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from unicron.core.errors import UsageError
from unicron.core.events import NodeBack, NodeLost, PlanEvent, TaskDone, TasksArrived
from unicron.planning.planner import ClusterState, Plan, PlanCache, advance, explained, plan


@dataclass(frozen=True)
class PlanTable:
    state: ClusterState
    now: Plan  # the best plan with no event (a rebalance of the present)
    node_lost: Mapping[int, Plan]
    node_back: Plan | None  # None: not precomputed (a table of arrivals only)
    task_done: Mapping[str, Plan]
    task_arrived: Mapping[tuple[str, ...], Plan] = field(default_factory=dict)
    build_s: float = field(compare=False, default=0.0)
    distinct_solves: int = 0

    def lookup(self, event: PlanEvent) -> Plan:
        """The precomputed plan for ``event``; O(1)."""
        back = self.node_back
        if back is None and not isinstance(event, TasksArrived):
            raise UsageError(f"this table holds the queued submissions' arrival only, not {event}")
        if isinstance(event, NodeLost):
            found = self.node_lost.get(event.node)
            if found is None:
                healthy = self.state.healthy
                raise UsageError(
                    f"node {event.node} is not in service; nodes in service: {healthy[0]}..{healthy[-1]}"
                    if healthy
                    else "no node is in service"
                )
            # Nodes whose loss hits the same tasks share one plan; label it with this node (and
            # say a drain's in its words).
            return explained(found, self.state, event) if event.drained else replace(found, event=str(event))
        if isinstance(event, NodeBack):
            if event.node is not None and event.node in self.state.healthy:
                raise UsageError(f"node {event.node} is already in service")
            assert back is not None  # (checked above)
            return replace(back, event=str(event))
        if isinstance(event, TasksArrived):
            arrival = self.task_arrived.get(event.tasks)
            if arrival is None:
                raise UsageError(f"no queued submission of {', '.join(event.tasks)}")
            return arrival
        found = self.task_done.get(event.task)
        if found is None:
            raise UsageError(f"no task named {event.task!r}; tasks: {', '.join(sorted(self.task_done))}")
        return found


def _loss_signature(state: ClusterState, node: int) -> tuple[tuple[str, int], ...]:
    return tuple(sorted(state.assignment.get(node, {}).items()))


def build(state: ClusterState) -> PlanTable:
    started = time.perf_counter()
    cache = PlanCache()  # the events of a class share their base problem's sweeps (planner._solve)
    solves = 0
    by_signature: dict[tuple[tuple[str, int], ...], Plan] = {}
    node_lost: dict[int, Plan] = {}
    for node in state.healthy:
        signature = _loss_signature(state, node)
        if signature not in by_signature:
            by_signature[signature] = plan(state, NodeLost(node), cache)
            solves += 1
        node_lost[node] = by_signature[signature]
    task_done = {t.name: plan(state, TaskDone(t.name), cache) for t in state.tasks}
    names = [tuple(t.name for t in group) for group in state.arriving]
    task_arrived = {n: plan(state, TasksArrived(n), cache) for n in names}
    now = plan(state, None, cache)
    back = plan(state, NodeBack(), cache)
    solves += len(task_done) + len(task_arrived) + 2
    seconds = time.perf_counter() - started
    return PlanTable(state, now, node_lost, back, task_done, task_arrived, seconds, solves)


def build_arrivals(state: ClusterState) -> PlanTable:
    """A table of the queued submissions' arrival (and the present) only: what a submission waits
    for, two solves instead of a full table's hundreds; the full table is built after the
    arrival's plan is carried out, from the state it leads to."""
    started = time.perf_counter()
    cache = PlanCache()
    names = [tuple(t.name for t in group) for group in state.arriving]
    task_arrived = {n: plan(state, TasksArrived(n), cache) for n in names}
    now = plan(state, None, cache)
    seconds = time.perf_counter() - started
    return PlanTable(state, now, {}, None, {}, task_arrived, seconds, len(task_arrived) + 1)


def refresh(table: PlanTable, event: PlanEvent | None) -> PlanTable:
    """Carry out the table's answer to ``event`` and precompute the next table."""
    chosen = table.now if event is None else table.lookup(event)
    return build(advance(table.state, event, chosen))

"""The coordinator's planner front: answer a cluster event with the plan computed ahead for it.

After every plan is carried out, the table of plans for the likely next events (each node lost,
a node back, each task finishing: :mod:`unicron.planning.plantable`) is rebuilt in the
background from the state that plan leads to. When the next reconcile finds the cluster changed
by exactly one such event since the table was built, the answer is a lookup. Anything else (a
task arriving, several events at once, a failure that shrank a task below what the table
assumed, new throughput measurements) is solved on the spot, and the reason is recorded.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace

from unicron.core.events import NodeBack, NodeLost, PlanEvent, TaskDone
from unicron.planning.placement import Assignment, place
from unicron.planning.planner import ClusterState, Plan, plan
from unicron.planning.plantable import PlanTable, build


@dataclass(frozen=True)
class Decided:
    plan: Plan
    layout: Assignment  # node -> {task: workers}, the placement of the plan
    source: str  # "table" or "solved"
    event: PlanEvent | None  # the event the table answered (None: solved, or no change)
    why: str  # why it was solved rather than looked up
    seconds: float  # lookup or solve time
    rebalance: bool = False  # the cluster is as the previous plan left it: only curves changed


def _state_key(state: ClusterState) -> tuple[object, ...]:
    return (
        state.healthy,
        tuple(t.name for t in state.tasks),
        repr(sorted(_normal(state.assignment).items())),
    )


def _normal(assignment: Mapping[int, Mapping[str, int]]) -> dict[int, dict[str, int]]:
    return {n: {t: c for t, c in per.items() if c} for n, per in assignment.items() if any(per.values())}


def event_between(before: ClusterState, after: ClusterState) -> PlanEvent | str | None:
    """The single plan event that turns ``before`` (what the table was built for) into ``after``
    (the cluster now, before anything is moved); None when nothing changed; a string saying why
    when the change is not one event the table holds."""
    lost = set(before.healthy) - set(after.healthy)
    back = set(after.healthy) - set(before.healthy)
    names_before = {t.name for t in before.tasks}
    names_after = {t.name for t in after.tasks}
    done, arrived = names_before - names_after, names_after - names_before
    if arrived:
        return f"task(s) arrived: {', '.join(sorted(arrived))}"
    changes = len(lost) + len(back) + len(done)
    if changes > 1:
        return f"{changes} events at once"
    expected = _normal(before.assignment)
    event: PlanEvent | None = None
    if lost:
        (node,) = lost
        event = NodeLost(node)
        expected.pop(node, None)
    elif back:
        event = NodeBack(next(iter(back)))
    elif done:
        (name,) = done
        event = TaskDone(name)
        expected = _normal({n: {t: c for t, c in per.items() if t != name} for n, per in expected.items()})
    if _normal(after.assignment) != expected:
        return "workers changed beyond the event (a failure shrank a task)"
    return event


class Allocator:
    """Plans for the coordinator: lookups in a precomputed table, refreshed after each plan."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="plan-table")
        self._building: Future[PlanTable] | None = None
        self._building_version = -1
        self._refreshed_for: tuple[object, ...] | None = None
        self.table: PlanTable | None = None
        self.table_version = -1  # the curves version the table was built with

    def decide(self, state: ClusterState, curves_version: int) -> Decided:
        """The plan for ``state``: looked up when the table answers it, else solved."""
        started = time.perf_counter()
        rebalance = self._refreshed_for is not None and self._refreshed_for[:-1] == _state_key(state)
        table, why = self._ready_table(curves_version)
        if table is not None:
            found = event_between(table.state, state)
            if isinstance(found, str):
                why = found
            else:
                chosen = table.now if found is None else table.lookup(found)
                if found is None and _normal(state.assignment) != _normal(table.state.assignment):
                    why = "workers changed"
                else:
                    layout = place(chosen.allocation(), state.healthy, state.gpus_per_node, state.assignment)
                    seconds = time.perf_counter() - started
                    return Decided(chosen, layout, "table", found, "", seconds, rebalance)
        best = plan(state)
        layout = place(best.allocation(), state.healthy, state.gpus_per_node, state.assignment)
        return Decided(best, layout, "solved", None, why, time.perf_counter() - started, rebalance)

    def refresh(self, state: ClusterState, decided: Decided, curves_version: int) -> None:
        """Precompute the next table (in the background) from the state ``decided`` leads to."""
        expected = replace(state, assignment=decided.layout)
        key = (*_state_key(expected), curves_version)
        if key == self._refreshed_for:
            return  # the table (built or being built) already answers from this state
        self._refreshed_for = key
        if self._building is not None:
            self._building.cancel()
        self._building = self._pool.submit(build, expected)
        self._building_version = curves_version

    def _ready_table(self, curves_version: int) -> tuple[PlanTable | None, str]:
        if self._building is not None:
            if not self._building.done():
                return None, "the plan table is still being built"
            building, self._building = self._building, None
            try:
                self.table, self.table_version = building.result(), self._building_version
            except Exception as exc:  # a table is an optimisation: solve instead
                self.table = None
                return None, f"the plan table could not be built: {exc}"
        if self.table is None:
            return None, "no plan table yet"
        if self.table_version != curves_version:
            return None, "throughput measurements changed since the table was built"
        return self.table, ""

    def wait(self, timeout: float = 30.0) -> None:
        """Block until the table being built is ready (tests, shutdown)."""
        if self._building is not None:
            self._building.result(timeout)
            self._ready_table(self._building_version)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

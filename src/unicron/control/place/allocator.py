"""The coordinator's planner front: answer a cluster event with the plan computed ahead for it.

After every plan is carried out, the table of plans for the likely next events (each node lost,
a node back, each task finishing, each queued submission arriving:
:mod:`unicron.planning.plantable`) is rebuilt in the background from the state that plan leads
to. It is also rebuilt when its inputs change without an event: a submission (queued until the
table that holds its arrival is ready, :meth:`Allocator.rebuild` and :meth:`Allocator.poll`) and
new throughput measurements (until the new table is ready, events are answered from the one
built with the previous measurements). When a reconcile finds the cluster changed by exactly one
such event since the table was built, the answer is a lookup, whatever a recovery did to the
workers meanwhile (its plan is laid out over the workers as they are). Anything else (several
events at once, a failure that shrank a task with no cluster event, a submission the table does
not hold) is solved on the spot, and the reason is recorded.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace

from unicron.core.errors import UsageError
from unicron.core.events import NodeBack, NodeLost, PlanEvent, TaskDone, TasksArrived
from unicron.planning.placement import Assignment, place
from unicron.planning.planner import ClusterState, Plan, plan
from unicron.planning.plantable import PlanTable, build, build_arrivals


@dataclass(frozen=True)
class Decided:
    plan: Plan
    layout: Assignment  # node -> {task: workers}, the placement of the plan
    source: str  # "table" or "solved"
    event: PlanEvent | None  # the event the table answered (None: solved, or no change)
    why: str  # why it was solved rather than looked up (or what the table it came from lacks)
    seconds: float  # lookup or solve time
    rebalance: bool = False  # the cluster is as the previous plan left it: only curves changed


def _state_key(state: ClusterState) -> tuple[object, ...]:
    return (
        state.healthy,
        tuple(t.name for t in state.tasks),
        repr(sorted(_normal(state.assignment).items())),
        tuple(tuple(t.name for t in group) for group in state.arriving),
    )


def _normal(assignment: Mapping[int, Mapping[str, int]]) -> dict[int, dict[str, int]]:
    return {n: {t: c for t, c in per.items() if c} for n, per in assignment.items() if any(per.values())}


def event_between(before: ClusterState, after: ClusterState) -> PlanEvent | str | None:
    """The single plan event that turns ``before`` (what the table was built for) into ``after``
    (the cluster now): a node out of service or back, a task ended or arrived, told by the sets
    of healthy nodes and of tasks, which change only by such events. None when neither changed;
    a string saying why when the change is not one event the table holds. Workers that a
    recovery moved meanwhile do not hide the event (see :func:`moved_beyond`): a recovery acts
    at once, before the plan, and a task that recovers by relaunching has none left running."""
    lost = set(before.healthy) - set(after.healthy)
    back = set(after.healthy) - set(before.healthy)
    names_before = {t.name for t in before.tasks}
    names_after = {t.name for t in after.tasks}
    done, arrived = names_before - names_after, names_after - names_before
    queued = {frozenset(t.name for t in g): tuple(t.name for t in g) for g in before.arriving}
    if arrived and frozenset(arrived) not in queued:
        return f"task(s) arrived: {', '.join(sorted(arrived))}"
    changes = len(lost) + len(back) + len(done) + (1 if arrived else 0)
    if changes > 1:
        return f"{changes} events at once"
    if lost:
        return NodeLost(next(iter(lost)))
    if back:
        return NodeBack(next(iter(back)))
    if done:
        return TaskDone(next(iter(done)))
    if arrived:
        return TasksArrived(queued[frozenset(arrived)])  # the newcomers hold no workers yet
    if _normal(after.assignment) != _normal(before.assignment):
        return "workers changed with no cluster event (a failure shrank a task)"
    return None


def moved_beyond(before: ClusterState, after: ClusterState, event: PlanEvent) -> bool:
    """Whether the workers changed beyond what ``event`` itself took away (a recovery moved
    them: survivors re-formed, a task stopped to relaunch)."""
    expected = _normal(before.assignment)
    if isinstance(event, NodeLost):
        expected.pop(event.node, None)
    elif isinstance(event, TaskDone):
        expected = _normal(
            {n: {t: c for t, c in per.items() if t != event.task} for n, per in expected.items()}
        )
    return _normal(after.assignment) != expected


class Allocator:
    """Plans for the coordinator: lookups in a precomputed table, refreshed after each plan and
    whenever the planner's inputs change."""

    def __init__(self, builder: Callable[[ClusterState], PlanTable] = build) -> None:
        self._builder = builder  # tests slow it down to see what is answered meanwhile
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="plan-table")
        self._building: Future[PlanTable] | None = None
        self._building_version = -1
        self._refreshed_for: tuple[object, ...] | None = None
        self._wake = False  # the build under way was asked for by new inputs: plan once it is ready
        self.table: PlanTable | None = None
        self.table_version = -1  # the curves version the table was built with
        # Plans decided by source ("table": a lookup, "solved": on the spot) and tables started
        # ("rebuilds"), since start-up: what an operator watches (``metrics.py``).
        self.counts: dict[str, int] = {"table": 0, "solved": 0, "rebuilds": 0}

    def decide(
        self, state: ClusterState, curves_version: int, drained: frozenset[int] = frozenset()
    ) -> Decided:
        """The plan for ``state``: looked up when the table answers it, else solved. ``drained``:
        nodes out of service by an admin's drain (their leaving is said as such)."""
        started = time.perf_counter()
        rebalance = self._refreshed_for is not None and self._refreshed_for[:-1] == _state_key(state)
        table, why = self._ready_table(curves_version)
        if table is not None:
            found = event_between(table.state, state)
            if isinstance(found, NodeLost) and found.node in drained:
                found = replace(found, drained=True)
            if isinstance(found, str):
                why = found
            else:
                chosen: Plan | None = None
                try:
                    chosen = table.now if found is None else table.lookup(found)
                except UsageError as exc:  # a table of arrivals only: the event is not in it
                    why = str(exc)
                if found is not None and moved_beyond(table.state, state, found):
                    why = "workers moved by a recovery since: the table's plan for the event, laid out anew"
                if chosen is not None:
                    layout = place(
                        chosen.allocation(),
                        state.healthy,
                        state.gpus_per_node,
                        state.assignment,
                        state.replica_sizes,
                    )
                    seconds = time.perf_counter() - started
                    self.counts["table"] += 1
                    return Decided(chosen, layout, "table", found, why, seconds, rebalance)
        best = plan(state)
        layout = place(
            best.allocation(), state.healthy, state.gpus_per_node, state.assignment, state.replica_sizes
        )
        self.counts["solved"] += 1
        return Decided(best, layout, "solved", None, why, time.perf_counter() - started, rebalance)

    def refresh(self, state: ClusterState, decided: Decided, curves_version: int) -> None:
        """Precompute the next table (in the background) from the state ``decided`` leads to."""
        expected = replace(state, assignment=decided.layout, arriving=())
        self._start(expected, curves_version, wake=False)

    def rebuild(self, state: ClusterState, curves_version: int) -> None:
        """The planner's inputs changed with no event (a submission queued in ``state.arriving``,
        new measurements in ``state.curves``): build the table for them in the background;
        :meth:`poll` says when it is ready to be planned with. A submission waits only for its
        arrival's plan (:func:`build_arrivals`), not for a full table."""
        self._start(state, curves_version, wake=True, arrivals_only=bool(state.arriving))

    def _start(
        self, state: ClusterState, curves_version: int, wake: bool, arrivals_only: bool = False
    ) -> None:
        key = (*_state_key(state), curves_version)
        if key == self._refreshed_for:
            return  # the table (built or being built) already answers from this state
        self._refreshed_for = key
        if self._building is not None:
            self._building.cancel()
        self._building = self._pool.submit(build_arrivals if arrivals_only else self._builder, state)
        self.counts["rebuilds"] += 1
        self._building_version = curves_version
        self._wake = wake

    def poll(self) -> bool:
        """True once, when a table asked for by :meth:`rebuild` is ready: time to plan."""
        if not self._wake or (self._building is not None and not self._building.done()):
            return False
        self._wake = False
        return True

    def _ready_table(self, curves_version: int) -> tuple[PlanTable | None, str]:
        if self._building is not None and self._building.done():
            building, self._building = self._building, None
            try:
                self.table, self.table_version = building.result(), self._building_version
            except Exception as exc:  # a table is an optimisation: solve instead
                self.table = None
                return None, f"the plan table could not be built: {exc}"
        if self._building is not None:
            if self.table is not None and self.table_version != curves_version == self._building_version:
                # Only the measurements changed: answer from the previous ones' table meanwhile.
                return self.table, "the table of the previous measurements (the new one is being built)"
            return None, "the plan table is still being built"
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

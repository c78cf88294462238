"""The coordinator's planner front: answer a cluster event with the plan computed ahead for it.

After every plan is carried out, the table of plans for the likely next events (each node lost,
a node back, each task finishing, each queued submission arriving:
:mod:`unicron.planning.plantable`) is rebuilt in the background from the state that plan leads
to. It is also rebuilt when its inputs change without an event: a submission (queued until the
table that holds its arrival is ready, :meth:`Allocator.rebuild` and :meth:`Allocator.poll`) and
new throughput measurements (until the new table is ready, events are answered from the one
built with the previous measurements). The events are told, not guessed: the actuator notes each
as it carries it out (``control/act/happened.py``), and a plan answers those since the state its
table was built for. One event (or none: the table's own plan) is a lookup, whatever a recovery
did to the workers meanwhile (a task stopped to relaunch, survivors re-formed: the plan is laid
out over the workers as they are). Anything else (several events at once, a submission the table
does not hold, a table not ready) is solved, and the plan event says which events and why.

A solve runs in the background, not on the coordinator's loop (at 2,048 nodes and 100 tasks it
takes 0.1-0.5 s, during which the loop would hear no heartbeat and answer no other failure).
By then each failure's recovery has acted (the survivors re-formed in place, or the task
stopped to relaunch); what waits for the plan is what only a plan does: a task stopped to
relaunch is launched, a task grows back, a submission starts. :meth:`Allocator.decide` says "not
yet" (None) until the solve is done, :meth:`Allocator.poll` says when it is, and the plan is then
laid out over the workers as they are. A solve whose cluster changed meanwhile (nodes in service,
tasks or their specs, measurements) is solved again for the cluster as it is; one that changed
during ``MAX_RESTARTS`` solves in a row is solved on the loop, so that a cluster that keeps
changing still gets its plan. The plan event says how long it waited from when it was first
asked for (``waited_s``) and how often its solve was started again (``restarts``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace

from unicron.control.act.happened import Happened, net
from unicron.core.errors import UsageError
from unicron.core.events import NodeBack, NodeLost, PlanEvent, TaskDone, TasksArrived, listed
from unicron.planning.placement import Assignment, place
from unicron.planning.planner import ClusterState, Plan, plan, restated
from unicron.planning.plantable import PlanTable, build, build_arrivals

# Why a plan came from the table before the one being built (``_ready_table``).
BEFORE = "the table before the one being built"


@dataclass(frozen=True)
class Decided:
    plan: Plan
    layout: Assignment  # node -> {task: workers}, the placement of the plan
    source: str  # "table" or "solved"
    event: PlanEvent | None  # the event the table answered (None: solved, or no change)
    why: str  # why it was solved rather than looked up (or what the table it came from lacks)
    seconds: float  # lookup or solve time
    rebalance: bool = False  # the cluster is as the previous plan left it: only curves changed
    events: tuple[PlanEvent, ...] = ()  # the cluster events it answers (several: solved)
    waited_s: float = 0.0  # solved in the background: from when it was first asked until now
    restarts: int = 0  # how often its solve was started again for a cluster that changed meanwhile


@dataclass
class Solving:
    """A plan being solved in the background for ``state``, and why the table could not answer."""

    state: ClusterState
    curves_version: int
    why: str
    asked: float  # perf_counter when it was first asked for (before any restart)
    future: Future[Solved]  # the plan, the solve's own time, its layout over ``state``
    restarts: int = 0  # started again for a cluster that changed meanwhile
    told: bool = False  # :meth:`Allocator.poll` said it is done


# A solve started again this often in a row for a cluster that kept changing is solved on the
# loop instead: the changes do not keep every plan away (a relaunch waits for one).
MAX_RESTARTS = 3


def gone_by(solving: Solving, state: ClusterState, curves_version: int) -> bool:
    """Whether the cluster changed since ``solving`` was asked for in a way its plan would not
    answer: the nodes in service, the tasks or their specs (a name submitted again may be
    another task), the measurements. Workers a recovery moved do not count (the plan is laid
    out over them as they are)."""
    return (
        solving.curves_version != curves_version
        or solving.state.tasks != state.tasks
        or unexplained(solving.state, state, None) is not None
    )


@dataclass(frozen=True)
class Solved:
    """A solve's plan, how long it took, and its layout over the workers it was solved for."""

    plan: Plan
    seconds: float
    layout: Assignment | None  # None: it could not be laid out (the loop lays it out, raising there)


def timed(solve: Callable[[ClusterState], Plan], state: ClusterState) -> Solved:
    """``solve(state)``, how long it took, and the plan laid out over ``state``'s workers (on the
    solver's thread: at 2,048 nodes a layout is a few milliseconds the loop need not spend where
    the workers are still where they were when the solve was asked for)."""
    started = time.perf_counter()
    solved = solve(state)
    seconds = time.perf_counter() - started
    try:
        layout: Assignment | None = laid_out(solved, state)
    except ValueError:  # (raised where a plan is carried out: on the loop, as for any plan)
        layout = None
    return Solved(solved, seconds, layout)


@dataclass(frozen=True)
class Asked:
    """The state the last table was asked for, as a key: its nodes in service, tasks and
    submissions by name, where their workers are (without empty rows), and its measurements'
    version. (Its own copy of the workers: a state's rows are not the key's to keep.)"""

    healthy: tuple[int, ...]
    tasks: tuple[str, ...]
    arriving: tuple[tuple[str, ...], ...]
    curves_version: int
    workers: Assignment

    @classmethod
    def of(cls, state: ClusterState, curves_version: int) -> Asked:
        arriving = tuple(tuple(t.name for t in group) for group in state.arriving)
        tasks = tuple(t.name for t in state.tasks)
        return cls(state.healthy, tasks, arriving, curves_version, _normal(state.assignment))

    def holds(self, state: ClusterState, curves_version: int | None = None) -> bool:
        """Whether ``state`` is the one asked for (with ``curves_version``; None: any), the
        cheap parts compared first: the workers' places are read only if all else is the same
        (at 2,048 nodes they were most of a plan's decision)."""
        return (
            (curves_version is None or curves_version == self.curves_version)
            and self.healthy == state.healthy
            and self.tasks == tuple(t.name for t in state.tasks)
            and self.arriving == tuple(tuple(t.name for t in group) for group in state.arriving)
            and same_workers(state.assignment, self.workers)
        )


def rebalancing(refreshed_for: Asked | None, state: ClusterState) -> bool:
    """Whether ``state`` is the one the last table was asked for (``refreshed_for``): nothing
    happened but new measurements."""
    return refreshed_for is not None and refreshed_for.holds(state)


def _normal(assignment: Mapping[int, Mapping[str, int]]) -> dict[int, dict[str, int]]:
    return {n: {t: c for t, c in per.items() if c} for n, per in assignment.items() if any(per.values())}


_NO_ROW: Mapping[str, int] = {}


def same_workers(
    now: Mapping[int, Mapping[str, int]],
    before: Mapping[int, Mapping[str, int]],
    lost: int | None = None,
    done: str | None = None,
) -> bool:
    """Whether the workers ``now`` are those ``before`` less those of node ``lost`` and of task
    ``done`` (empty rows and zero counts are none): compared row by row, each row made without
    its zeros only where the two differ (the usual rows have none), and in C where nothing is
    taken away and they are equal."""
    if lost is None and done is None and now == before:
        return True
    for node in now.keys() | before.keys():
        row_now = now.get(node, _NO_ROW)
        row_before = _NO_ROW if node == lost else before.get(node, _NO_ROW)
        if row_now == row_before and (done is None or done not in row_before):
            continue
        if _row(row_now, None) != _row(row_before, done):
            return False
    return True


def _row(row: Mapping[str, int], done: str | None) -> dict[str, int]:
    return {t: c for t, c in row.items() if c and t != done}


def unexplained(before: ClusterState, after: ClusterState, event: PlanEvent | None) -> str | None:
    """Why ``after`` (the cluster now) is not ``before`` (what the table was built for) changed by
    ``event`` (None: by nothing) alone, if it is not: the sets of nodes in service and of tasks
    change only by events the actuator notes (``act/happened.py``), so a difference there means
    one went untold, and the table's state is not the one to answer from. Workers that a recovery
    moved meanwhile do not count (see :func:`moved_beyond`): a recovery acts at once, before the
    plan, and a task that recovers by relaunching has none left running."""
    healthy, names = set(before.healthy), {t.name for t in before.tasks}
    if isinstance(event, NodeLost):
        healthy.discard(event.node)
    elif isinstance(event, NodeBack) and event.node is not None:
        healthy.add(event.node)
    elif isinstance(event, TaskDone):
        names.discard(event.task)
    elif isinstance(event, TasksArrived):
        names.update(event.tasks)
    said = "no event" if event is None else str(event)
    if healthy != set(after.healthy):
        return f"the nodes in service changed beyond {said} (the table's state is not the cluster's)"
    if names != {t.name for t in after.tasks}:
        return f"the tasks changed beyond {said} (the table's state is not the cluster's)"
    return None


def moved_beyond(before: ClusterState, after: ClusterState, event: PlanEvent | None) -> bool:
    """Whether the workers changed beyond what ``event`` (None: nothing) itself took away (a
    recovery moved them: survivors re-formed, a task stopped to relaunch)."""
    lost = event.node if isinstance(event, NodeLost) else None
    done = event.task if isinstance(event, TaskDone) else None
    return not same_workers(after.assignment, before.assignment, lost, done)


def laid_out(chosen: Plan, state: ClusterState) -> Assignment:
    """The plan's allocation placed over the nodes in service, moving as few workers as it can."""
    allocation = chosen.allocation()
    return place(allocation, state.healthy, state.gpus_per_node, state.assignment, state.replica_sizes)


class Allocator:
    """Plans for the coordinator: lookups in a precomputed table, refreshed after each plan and
    whenever the planner's inputs change."""

    def __init__(
        self,
        builder: Callable[[ClusterState], PlanTable] = build,
        happened: Happened | None = None,
        solve: Callable[[ClusterState], Plan] = plan,
    ) -> None:
        self._builder = builder  # tests slow it down to see what is answered meanwhile
        self._solve = solve  # (likewise)
        self.happened = happened or Happened()  # the cluster events, as the actuator noted them
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="plan-table")
        # Its own thread: a solve never waits behind a table being built for a state gone by.
        self._solver = ThreadPoolExecutor(max_workers=1, thread_name_prefix="plan-solve")
        # Each thread started now: a pool starts its thread on its first task and waits for it to
        # run, which under a busy loop took 5 ms of the first node loss's tick in the decide bench.
        wait([self._pool.submit(int), self._solver.submit(int)])
        self.solving: Solving | None = None
        self._building: Future[PlanTable] | None = None
        self._building_version = -1
        self._building_after = 0  # the last event the state of the table being built had seen
        self._refreshed_for: Asked | None = None
        self._wake = False  # the build under way was asked for by new inputs: plan once it is ready
        self.table: PlanTable | None = None
        self.table_version = -1  # the curves version the table was built with
        self.table_after = 0  # the last event its state had seen: it answers the ones after
        self.answered = 0  # the last event a decision answered: a plan names those after
        # Plans decided by source ("table": a lookup, "solved": in the background) and tables started
        # ("rebuilds"), since start-up: what an operator watches (``metrics.py``).
        self.counts: dict[str, int] = {"table": 0, "solved": 0, "rebuilds": 0}

    def decide(self, state: ClusterState, curves_version: int) -> Decided | None:
        """The plan for ``state``: the table's answer to the cluster events since it was built
        (one event, or none: the table's own plan), else solved in the background, with why
        (None: being solved; :meth:`poll` says when to ask again)."""
        started = time.perf_counter()
        refreshed_for = self._refreshed_for  # (before the table's state below may change it)
        table, why = self._ready_table(curves_version)  # (it may take up a table just built)
        told = self.happened.since(self.table_after)  # what the table must answer
        if table is not None:
            try:
                events = None if told is None else net(told)
                answer: tuple[Plan, PlanEvent | None, str] | str = (
                    f"{why}: a submission is answered by the table built for it"
                    if why == BEFORE and any(isinstance(e, TasksArrived) for e in events or ())
                    else self._answer(table, state, events)
                )
            except Exception as exc:  # a table is an optimisation: a fault in its answer is solved
                # around, and said (before, it escaped the plan, whose events no plan answered
                # again: a task stayed unplanned; seen with a finished task left in a table's plan)
                answer = f"the table's answer failed: {exc!r}"
            if isinstance(answer, str):
                why = answer
            else:
                chosen, event, laid = answer
                why = "; ".join(w for w in (why, laid) if w)  # the table's caveat and the layout's
                layout = laid_out(chosen, state)
                self.counts["table"] += 1
                self._drop_solving()  # (the table answers what it was asked for, and more)
                rebalance = rebalancing(refreshed_for, state)
                seconds, events = time.perf_counter() - started, self._newly_answered()
                return Decided(chosen, layout, "table", event, why, seconds, rebalance, events)
        solved = self._solved(state, curves_version, why)
        if solved is None:
            return None
        best, layout, seconds, solving = solved
        rebalance = rebalancing(refreshed_for, state)
        self.counts["solved"] += 1
        waited = time.perf_counter() - solving.asked
        events = self._newly_answered()
        return Decided(
            best, layout, "solved", None, solving.why, seconds, rebalance, events, waited, solving.restarts
        )

    def unanswered(self) -> bool:
        """Whether cluster events happened that no plan answered yet."""
        return self.happened.last > self.answered

    def _newly_answered(self) -> tuple[PlanEvent, ...]:
        """The cluster events no plan answered before this one, taken as answered. The table
        may be older (a plan answered some of its events, its successor is being built) or newer
        (built from a state that already held events no plan had answered: new measurements, a
        submission)."""
        unanswered = self.happened.since(self.answered)
        self.answered = self.happened.last
        return () if unanswered is None else net(unanswered)

    def _solved(
        self, state: ClusterState, curves_version: int, why: str
    ) -> tuple[Plan, Assignment, float, Solving] | None:
        """The background solve's plan for ``state``, its layout over ``state``'s workers and the
        solve's time, once it is done; None while it is not (a solve is started for ``state`` if
        none is under way for its cluster). A plan solved for the same nodes, tasks and
        measurements is the plan now, said from the workers as they are and laid out over them,
        where a recovery moved them meanwhile (else as laid out beside the solve)."""
        solving = self.solving
        if solving is not None and gone_by(solving, state, curves_version):
            self._drop_solving()  # solved for a cluster gone by: again, as first asked
            restarts = solving.restarts + 1
            if restarts >= MAX_RESTARTS:
                said = f"{solving.why}; the cluster changed during {restarts} solves: solved on the loop"
                return self._laid(
                    timed(self._solve, state), state, replace(solving, why=said, restarts=restarts)
                )
            self._start_solve(state, curves_version, solving.why, solving.asked, restarts)
            return None
        if solving is None:
            self._start_solve(state, curves_version, why, time.perf_counter())
            return None
        if not solving.future.done():
            return None
        self.solving = None
        try:
            solved = solving.future.result()
        except Exception:  # the planner's own fault: solved again here, so that it is raised
            return self._laid(timed(self._solve, state), state, solving)
        if moved_beyond(solving.state, state, None):
            solved = replace(solved, plan=restated(solved.plan, state), layout=None)
        return self._laid(solved, state, solving)

    @staticmethod
    def _laid(
        solved: Solved, state: ClusterState, solving: Solving
    ) -> tuple[Plan, Assignment, float, Solving]:
        """The solved plan with its layout: as made beside the solve, else made here over the
        workers as they are (raising here, on the loop, where it cannot be laid out)."""
        layout = solved.layout if solved.layout is not None else laid_out(solved.plan, state)
        return solved.plan, layout, solved.seconds, solving

    def _start_solve(
        self, state: ClusterState, curves_version: int, why: str, asked: float, restarts: int = 0
    ) -> None:
        future = self._solver.submit(timed, self._solve, state)
        self.solving = Solving(state, curves_version, why, asked, future, restarts)

    def _drop_solving(self) -> None:
        if self.solving is not None:
            self.solving.future.cancel()
            self.solving = None

    def _answer(
        self, table: PlanTable, state: ClusterState, events: tuple[PlanEvent, ...] | None
    ) -> tuple[Plan, PlanEvent | None, str] | str:
        """The table's plan for ``events`` (its plan, why it was laid out anew), or why it has
        none: several events at once, an event it does not hold, a state it was not built for."""
        if events is None:
            return "more cluster events since the table was built than are kept"
        if len(events) > 1:
            return f"{len(events)} events at once: {listed([str(e) for e in events])}"
        event = events[0] if events else None
        beyond = unexplained(table.state, state, event)
        if beyond is not None:
            return beyond
        try:
            chosen = table.now if event is None else table.lookup(event)
        except UsageError as exc:  # a table of arrivals only: the event is not in it
            return str(exc)
        why = ""
        if moved_beyond(table.state, state, event):
            # A recovery stopped or shrank a task (no cluster event: the nodes and tasks are the
            # table's): the same cluster has the same best plan, laid over the workers as they are.
            said = "no cluster event" if event is None else "the event"
            why = f"workers moved by a recovery since: the table's plan for {said}, laid out anew"
            chosen = restated(chosen, state)  # (its reasons said from the workers as they are)
        return chosen, event, why

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
        if self._refreshed_for is not None and self._refreshed_for.holds(state, curves_version):
            # The table (built or being built) is of this state already: the events so far led
            # to it (a plan answered them), so it answers the ones after.
            if self._building is not None:
                self._building_after = self.happened.last
            else:
                self.table_after = self.happened.last
            return
        self._refreshed_for = Asked.of(state, curves_version)
        if self._building is not None:
            self._building.cancel()
        self._building = self._pool.submit(build_arrivals if arrivals_only else self._builder, state)
        self.counts["rebuilds"] += 1
        self._building_version = curves_version
        self._building_after = self.happened.last
        self._wake = wake

    def poll(self) -> bool:
        """True once, when a table asked for by :meth:`rebuild` is ready or a plan being solved
        is done: time to plan."""
        solving = self.solving
        if solving is not None and not solving.told and solving.future.done():
            solving.told = True
            return True
        if not self._wake or (self._building is not None and not self._building.done()):
            return False
        self._wake = False
        return True

    def _ready_table(self, curves_version: int) -> tuple[PlanTable | None, str]:
        if self._building is not None and self._building.done():
            building, self._building = self._building, None
            try:
                self.table, self.table_version = building.result(), self._building_version
                self.table_after = self._building_after
            except Exception as exc:  # a table is an optimisation: solve instead
                self.table = None
                self._refreshed_for = None  # and build it again at the next plan, not never
                return None, f"the plan table could not be built: {exc}"
        if self._building is not None:
            if self.table is not None and self.table_version != curves_version == self._building_version:
                # Only the measurements changed: answer from the previous ones' table meanwhile.
                return self.table, "the table of the previous measurements (the new one is being built)"
            if self.table is not None and self.table_version == curves_version and not self._wake:
                # A table follows every plan, and plans follow every recovery: in a burst of
                # crashes one is nearly always being built, and a node lost meanwhile was solved
                # (every loss in the decide bench). The table before it answers what it holds,
                # as it answers after any recovery (the cluster checked, the plan laid out anew
                # over the workers as they are); more events since it than one are solved. Not
                # while a table for new inputs is built (``rebuild``: a submission): a name
                # submitted again is another task, which the table before knows by its name only.
                return self.table, BEFORE
            return None, "the plan table is still being built"
        if self.table is None:
            return None, "no plan table yet"
        if self.table_version != curves_version:
            return None, "throughput measurements changed since the table was built"
        return self.table, ""

    def in_background(self) -> bool:
        """Whether a table is being built or a plan solved (on their own threads)."""
        building = self._building is not None and not self._building.done()
        return building or (self.solving is not None and not self.solving.future.done())

    def wait(self, timeout: float = 30.0) -> None:
        """Block until the table being built and the plan being solved are ready (tests)."""
        if self.solving is not None:
            wait([self.solving.future], timeout)
        if self._building is not None:
            self._building.result(timeout)
            self._ready_table(self._building_version)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._solver.shutdown(wait=False, cancel_futures=True)

"""Rows of processes that no longer run, their exits unrecorded: ended tasks' rows holding slots,
and running tasks' workers.

A row in a slot-holding phase (launching, running, spare) keeps its slot until the process's
exit is recorded (``slots.py``). An exit can go unrecorded: an agent that dies with its workers
and is back before its node is declared lost reports no exits at all; a spare of a task that
ended just before a restart is not among the spares a successor restores
(``Placer.rebuild_spares``), so its exit is not matched to it. A task that runs has its own
guards (launch timeouts, hang detection); an ended task has none, and its rows would hold their
slots for good: a plan that gives them to another task waits for them for ever.

Each agent lists every process it has on each heartbeat (running or exited), with the reports
of the exits it no longer lists (a registration's list is not used: the reports follow it). A
row of an ended task whose node's latest list, received after the task ended, does not show its
process running has lost its process: the row is ended. A process is matched by its identity or
by its pid (a survivor renamed in place is listed under its former identity until its agent
catches up). A row whose process was never seen (no pid) is given ``launch_timeout_s`` to start
first: the agent may not have carried its launch order out yet.

A running task's guards find such a worker late, or never. Past its last step hang detection
stands aside (the workers are saving and leaving), so a worker gone unreported there was waited
for for ever (rank 0's report of the final state may be the one lost). Before it, hang detection
takes ``hang_cap_s``, and the survivors' errors name no dead rank: they wait
``heartbeat_deadline_s`` + ``cause_grace_s`` for a death that is never reported, then re-form
with every member, the dead ones included, and wait for them again. A task starting (a launch
before its first step) has only the start time-out (``start_timeout_s``, ten minutes): a
launch whose workers died with their agent was waited for that long. A running row of a running
or starting task whose pid its node's latest list, received after the row's launch, no longer holds at all
(its agent forgot it, or was restarted: a worker dies with its agent, ``processes.py``) is
taken as an exit within a heartbeat interval. Past the last step as a clean one: the task
finishes if its final state is known saved, else it is relaunched from its checkpoint
(``exits.py``), as when every worker has left. Before it as a failure whose status nobody knows:
the survivors go on without the rank, as for any worker's death.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from unicron.brain.records import TaskRecord, WorkerRecord
from unicron.control.context import Context
from unicron.core.protocol import ExitReport, WorkerState
from unicron.core.states import TaskState, WorkerPhase

WorkerKey = tuple[str, int, int]
# A task whose generation's processes are to be running: training, or starting (a launch before
# its first step, a generation re-formed in place). A starting launch's worker gone with its
# agent was waited for until ``start_timeout_s`` (ten minutes: the soak hung on it).
TRAINING = frozenset({TaskState.RUNNING, TaskState.STARTING})


@dataclass(frozen=True)
class Listing:
    """What a node's agent last said it runs, and when that was received."""

    at: float
    running: frozenset[WorkerKey]
    pids: frozenset[int]  # of the running ones
    any_pids: frozenset[int]  # of every process listed, exited ones too

    @staticmethod
    def of(reported: Iterable[WorkerState], at: float) -> Listing:
        listed = list(reported)
        alive = [w for w in listed if w.running]
        keys = frozenset((w.task, w.generation, w.rank) for w in alive)
        return Listing(at, keys, frozenset(w.pid for w in alive), frozenset(w.pid for w in listed))

    def shows(self, row: WorkerRecord) -> bool:
        return row.key in self.running or (row.pid is not None and row.pid in self.pids)


def gone(
    rows: Sequence[WorkerRecord],
    tasks: Mapping[str, TaskRecord | None],
    listings: Mapping[str, Listing],
    now: float,
    launch_timeout_s: float,
) -> list[WorkerRecord]:
    """The ``rows`` (holding slots) of ended tasks whose processes no longer run; pure."""
    found: list[WorkerRecord] = []
    for row in rows:
        task, listing = tasks.get(row.task), listings.get(row.node)
        if task is not None and task.state.live:
            continue  # a running task's own guards judge its workers
        ended_at = (task.finished or 0.0) if task is not None else 0.0
        if listing is None or listing.at <= ended_at:
            continue  # nothing heard from its node since the task ended
        if listing.shows(row):
            continue
        if row.pid is None and now - row.launched < launch_timeout_s:
            continue  # its launch order may not have been carried out yet
        found.append(row)
    return found


def gone_while_running(
    rows: Sequence[WorkerRecord],
    tasks: Mapping[str, TaskRecord | None],
    listings: Mapping[str, Listing],
) -> list[tuple[WorkerRecord, TaskRecord]]:
    """The running ``rows`` of running or starting tasks whose processes their node's agent no
    longer has (listed neither running nor exited), with their tasks; pure."""
    found: list[tuple[WorkerRecord, TaskRecord]] = []
    for row in rows:
        task, listing = tasks.get(row.task), listings.get(row.node)
        if task is None or task.state not in TRAINING or task.generation != row.generation:
            continue
        if row.state is not WorkerPhase.RUNNING or row.pid is None or listing is None:
            continue
        unlisted = row.pid not in listing.any_pids and row.key not in listing.running
        if unlisted and listing.at > row.launched:
            found.append((row, task))
    return found


@dataclass(frozen=True)
class Swept:
    """What a sweep found: whether a slot was freed, and the exits of running tasks' workers
    gone unreported (each with its node), for the coordinator to handle as its agent's."""

    freed: bool = False
    exits: tuple[tuple[ExitReport, str], ...] = ()


@dataclass
class Vanished:
    """The agents' latest lists, and the rows ended by them: each pass (every tick), the rows on
    the nodes that listed since the last one. A row is judged against each list its node sends:
    whatever makes a row gone (its task ended, its process unlisted) is seen in its node's next
    list, so judging again a row whose node said nothing new finds nothing (and every row of
    2,048 nodes each pass was a large cluster's costliest routine work). The nodes list in turn
    over a heartbeat interval, so each pass judges a share of them: judged all at once, once an
    interval, the ~16,000 rows of 2,048 nodes took ~40 ms of the loop in one tick. Only a
    launch's time running out needs no new list: such a row's node is judged again once an
    interval until it has. A running task found with a rank gone has all its rows judged, on
    every node, so that its ranks gone are taken out together."""

    ctx: Context
    listings: dict[str, Listing] = field(default_factory=dict)
    fresh: set[str] = field(default_factory=set)  # nodes listed since the last pass
    launching: set[str] = field(default_factory=set)  # nodes with rows whose launch time runs
    swept: float = 0.0  # when the launching nodes were last judged

    def listed(self, node: str, reported: Iterable[WorkerState], now: float) -> None:
        self.listings[node] = Listing.of(reported, now)
        self.fresh.add(node)

    def registered(self, node: str) -> None:
        """The node's agent registered (again). Its list is not used (the reports follow it), but
        a pid it tells is taken (``Coordinator._reconcile_workers``): the node's earlier list,
        heard before that process started, would find it missing (a starting task's healthy
        worker was taken out so). Nothing of the node is judged until it lists again."""
        self.listings.pop(node, None)
        self.fresh.discard(node)

    def sweep(self, now: float) -> Swept:
        """End the rows whose processes are gone; return the exits to handle."""
        limits = self.ctx.limits
        nodes, self.fresh = self.fresh, set()
        if now - self.swept >= limits.heartbeat_interval_s or now < self.swept:
            self.swept = now
            nodes, self.launching = nodes | self.launching, set()
        if not nodes:
            return Swept()
        rows = [w for node in sorted(nodes) for w in self.ctx.store.holding_on(node)]
        tasks = {name: self.ctx.store.task(name) for name in {w.task for w in rows}}
        found = gone(rows, tasks, self.listings, now, limits.launch_timeout_s)
        # A row never seen is given its launch time before it is judged: its node is looked at
        # again once an interval until then, whether or not it lists again (it may never: a lost
        # node's spare of an ended task is ended only here).
        waiting = {w.node for w in rows if w.pid is None and now - w.launched < limits.launch_timeout_s}
        self.launching |= waiting
        for row in found:
            self._ended(row, WorkerPhase.STOPPED, "its task has ended and its node's agent no longer runs it")
        running = gone_while_running(rows, tasks, self.listings)
        if running:  # the tasks hit: their rows on every node, not only those that listed since
            judged, hit = {w.key for w in rows}, {row.task: task for row, task in running}
            more = [
                w
                for name, task in sorted(hit.items())
                for w in self.ctx.store.workers(name, task.generation, live=True)
                if w.key not in judged
            ]
            running += gone_while_running(more, tasks, self.listings)
        # Every gone row is ended before any exit is handled: a recovery that the first starts
        # must not take the others for survivors (their exits then belong to a generation left).
        for row, _ in running:
            self._ended(row, WorkerPhase.LOST, "its task runs and its node's agent no longer has it")
        exits = []
        for row, task in running:
            key = {"task": row.task, "generation": row.generation, "rank": row.rank, "node": row.node}
            # Past the last step taken as a clean exit: what decides is whether the final state is
            # known saved, whatever its status was. Before it, a failure of unknown status (none
            # is made up).
            last = task.step >= self.ctx.spec(row.task).run.iterations
            exits.append((ExitReport(**key, code=0 if last else None, signal=None, time=now), row.node))
        return Swept(bool(found or running), tuple(exits))

    def _ended(self, row: WorkerRecord, to: WorkerPhase, why: str) -> None:
        self.ctx.act.worker_phase(row.key, to)
        self.ctx.act.record(
            "worker_gone",
            task=row.task,
            node=row.node,
            generation=row.generation,
            rank=row.rank,
            was=row.state.value,
            why=why,
        )

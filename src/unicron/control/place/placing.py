"""Placing: the planner's answer for the cluster, carried out task by task, and the hot spares.

On node loss, node return, task arrival and completion the planner's answer (looked up in a
precomputed table where it can be: ``allocator.py``; a submission waits for the table that holds
its arrival, see :meth:`Placer.submitted`) is carried out in place where the task
recovers in process (shrink at a step boundary, grow with newcomers that take their state from
live replicas), else by a restart from the checkpoint. Idle slots hold hot spares
(``spares.py`` chooses for which task).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from unicron.brain.effects import HostStore, Launch
from unicron.brain.records import TaskRecord, WorkerRecord
from unicron.brain.snapshot import Snapshot
from unicron.control.context import Context
from unicron.control.place.allocator import Allocator, Decided
from unicron.control.place.moves import (
    MoveKind,
    Part,
    TaskFacts,
    launch_effects,
    parts_of,
    restart_effects,
    wanted_by_task,
)
from unicron.control.place.rates import RateMeter
from unicron.control.place.spares import choose, in_the_way, seated, spare_gains
from unicron.control.recover.generations import Generations
from unicron.control.store.store import PLAN_EVENT
from unicron.core.events import TasksArrived, listed, named
from unicron.core.gpus import GpuType
from unicron.core.livespecs import LiveTaskSpec
from unicron.core.protocol import SPARE_GENERATION
from unicron.core.states import TaskState, WorkerPhase
from unicron.planning.placement import Assignment
from unicron.planning.planner import ClusterState, Plan
from unicron.planning.throughput import ThroughputCurve, curves_for

# Where a task's workers are: its members on each node as a snapshot had them, its newcomers'
# nodes, the nodes in service (name -> id) they were said by id for, and so said.
_Spread = tuple[Mapping[str, int], tuple[str, ...], dict[str, int], dict[int, int]]


def stranded(snapshot: Snapshot) -> bool:
    """Whether an active task still has members on a node out of service (being drained)."""
    healthy = snapshot.healthy()
    return any(
        w.node not in healthy
        for t in snapshot.tasks.values()
        if t.state.active
        for w in snapshot.live(t.name)
    )


@dataclass(frozen=True)
class HeldPlan:
    """A plan being carried out, with what it was decided from."""

    plan: Plan
    layout: Assignment
    names: dict[int, str]  # node id -> name
    state: ClusterState


@dataclass
class Spare:
    task: str
    rank: int  # its identity at the agent: (task, SPARE_GENERATION, rank)
    node: str
    local_rank: int
    since: float
    used: float | None = None  # when a grow took it (it keeps its entry until renamed)


@dataclass
class Placer:
    ctx: Context
    generations: Generations
    rates: RateMeter
    allocator: Allocator = field(init=False)  # answers the events the actuator notes
    spares: dict[tuple[str, int], Spare] = field(default_factory=dict)
    last_plan: dict[str, int] | None = None
    last_decided: Plan | None = None  # the plan carried out last (its expected WAF, per task too)
    pending: list[tuple[str, ...]] = field(default_factory=list)  # submissions not yet planned
    regrow: set[str] = field(default_factory=set)  # shrunk off a drained node: plan again after
    # A plan whose launches or grows wait for slots that processes still hold (``slots.py``):
    # the coordinator carries it out again until they are gone (``carry_out_held``).
    held: HeldPlan | None = None
    # task -> where its workers are (``_held_on``).
    _spread: dict[str, _Spread] = field(default_factory=dict, repr=False)
    # The nodes in service as a snapshot named them, and their ids both ways (``_in_service``).
    _service: tuple[frozenset[str], dict[int, str], dict[str, int], tuple[int, ...]] | None = field(
        default=None, repr=False
    )
    # The tasks' throughput curves and what they were computed from (``_curves``).
    _curves_of: tuple[tuple[LiveTaskSpec, ...], GpuType, int, int, dict[str, ThroughputCurve]] | None = field(
        default=None, repr=False
    )

    def __post_init__(self) -> None:
        self.allocator = Allocator(happened=self.ctx.act.happened)

    def cluster_state(self, snapshot: Snapshot) -> tuple[ClusterState, dict[int, str]]:
        """The planner's view of the snapshot: healthy nodes (by id) and where the active tasks'
        workers are: their members, and the newcomers of a grow under way (the plan that grew
        the task gave them their slots: without them, a plan decided before they join sees the
        task short by them, solves the table's state again, and may give their slots away)."""
        names, ids, healthy = self._in_service(snapshot)
        # A node's slots, from a lost one when none is in service: the table built then plans
        # the node's return, which with 1 slot gave a task of 2 or 4 none (it never relaunched).
        some = next(iter(names.values()), None) or next(iter(snapshot.nodes), None)
        slots = snapshot.nodes[some].slots if some is not None else 1
        assignment: dict[int, dict[str, int]] = {}
        live = list(snapshot.tasks.values())
        for task in live:
            if task.state.active:
                name = task.name
                for node, count in self._held_on(name, snapshot.spread(name), ids).items():
                    row = assignment.get(node)
                    if row is None:
                        assignment[node] = {name: count}
                    else:
                        row[name] = count
        for ended in self._spread.keys() - snapshot.tasks.keys():
            del self._spread[ended]
        specs = [self.ctx.spec(t.name) for t in live]
        hardware = self.ctx.settings.cluster
        gpu = hardware.gpu_type()
        curves = self._curves(specs, gpu, slots)
        state = ClusterState(
            slots,
            gpu,
            hardware.node_mtbf_hours,
            hardware.planner,
            healthy,
            assignment,
            tuple(specs),
            curves,
            next_node=max(names, default=0) + 1,
        )
        return state, names

    def _curves(self, specs: list[LiveTaskSpec], gpu: GpuType, slots: int) -> dict[str, ThroughputCurve]:
        """Every task's throughput curve, computed again only when the tasks' specs, the GPU, the
        node's slots or the measurements change (at 100 tasks, a tenth of a node loss's plan)."""
        kept = self._curves_of
        if (
            kept is not None
            and kept[1:4] == (gpu, slots, self.rates.version)
            and len(kept[0]) == len(specs)
            and all(a is b for a, b in zip(kept[0], specs, strict=True))
        ):
            return kept[4]
        measured = {s.name: self.rates.measured(s.name) for s in specs}
        samples = {s.name: self.rates.measured_samples(s.name) for s in specs}  # no FLOPs per sample
        curves = curves_for(specs, gpu, slots, measured, samples)
        self._curves_of = (tuple(specs), gpu, slots, self.rates.version, curves)
        return curves

    def _in_service(self, snapshot: Snapshot) -> tuple[dict[int, str], dict[str, int], tuple[int, ...]]:
        """The nodes in service: id -> name, name -> id, the ids in order; read again only when
        the set of them changes (the store keeps it until a node's state does)."""
        in_service = snapshot.healthy()
        kept = self._service
        if kept is None or kept[0] is not in_service:
            names = {snapshot.nodes[name].id: name for name in in_service}
            kept = (in_service, names, {name: i for i, name in names.items()}, tuple(sorted(names)))
            self._service = kept
        return kept[1], kept[2], kept[3]

    def _held_on(self, name: str, spread: Mapping[str, int], ids: dict[str, int]) -> dict[int, int]:
        """How many of the task's workers (``spread``: its members on each node, and the
        newcomers of its grow under way) are on each node in service, by id (the caller does not
        change it): said again only when one of them or the nodes in service change (the store
        gives a task's members' spread anew only when one of them changes)."""
        newcomers = tuple(w.node for w in self._newcomers(name))
        kept = self._spread.get(name)
        if kept is not None and kept[0] is spread and kept[1] == newcomers and kept[2] is ids:
            return kept[3]
        on = Counter(spread)
        on.update(newcomers)
        held = {ids[node]: count for node, count in on.items() if node in ids}
        self._spread[name] = (spread, newcomers, ids, held)
        return held

    def _newcomers(self, name: str) -> list[WorkerRecord]:
        """The live newcomers of the task's grow under way, if it has one."""
        growth = self.generations.growth(name)
        return [] if growth is None else self.ctx.store.workers(name, growth.generation, live=True)

    def submitted(self, names: tuple[str, ...]) -> None:
        """A submission is queued until the plan table that holds its arrival is built (in the
        background; ``allocator.poll`` says when), so that it is answered by a lookup too."""
        self.pending.append(names)
        self.inputs_changed()

    def inputs_changed(self) -> None:
        """New measurements or a queued submission: rebuild the plan table for them."""
        state, _ = self.cluster_state(self.ctx.store.snapshot())
        queued = {name for names in self.pending for name in names}
        # Every queued submission is admitted by the next plan: one arrival of them all.
        group = tuple(t for t in state.tasks if t.name in queued)
        settled = tuple(t for t in state.tasks if t.name not in queued)
        arriving = (group,) if group else ()
        self.allocator.rebuild(replace(state, tasks=settled, arriving=arriving), self.rates.version)
        if group:  # (noted after the table's start: its state holds the submission as queued)
            self.ctx.act.happened.note(TasksArrived(tuple(t.name for t in group)))

    def reconcile(self) -> None:
        """Divide the healthy slots with the planner and carry the plan out."""
        snapshot = self.ctx.store.snapshot()
        state, names = self.cluster_state(snapshot)
        if not state.tasks:
            self.keep_spares(snapshot, state, names, {})  # no task left: no spare has a purpose
            return
        decided = self.allocator.decide(state, self.rates.version)
        if decided is None:
            # Solved in the background (``allocator.py``); the allocator's poll wakes the next
            # plan. A plan held for slots goes on being carried out unless cluster events came
            # since it (then it is of a cluster gone by: it waits for the new plan too).
            if self.allocator.unanswered():
                self.held = None
            return
        self.pending.clear()  # every live task is in this plan
        best, layout = decided.plan, decided.layout
        if decided.rebalance and not stranded(snapshot):
            # Nothing happened but new measurements: move running tasks only for a clear gain.
            before = sum(d.waf_before for d in best.decisions)
            if best.waf < before * (1 + self.ctx.limits.rebalance_min_gain):
                assignment = {n: dict(a) for n, a in state.assignment.items()}
                self.keep_spares(snapshot, state, names, assignment)
                return
        self._record_plan(decided, snapshot)
        self.last_decided = best
        self._carry_out_plan(HeldPlan(best, layout, names, state))
        self.allocator.refresh(state, decided, self.rates.version)

    def carry_out_held(self) -> None:
        """Carry the held plan out again. Only processes leaving their slots changed since it
        was decided, so it is not decided anew (the table does not hold the in-between state:
        each tick of a stop's grace period would solve the plan)."""
        if self.held is not None:
            self._carry_out_plan(self.held)

    def _carry_out_plan(self, carried: HeldPlan) -> None:
        """Each task's part of the plan (``moves.parts_of``); the plan is held while any of it
        waits for slots."""
        snapshot = self.ctx.store.snapshot()
        live = [d.task for d in carried.plan.decisions if d.task in snapshot.tasks]
        wanted = wanted_by_task(carried.layout, carried.names)
        facts = {name: self._facts(name) for name in live}
        parts = parts_of(carried.plan.decisions, wanted, snapshot, facts, self.ctx.store.slots_in_use())
        for part in parts.now:
            self._carry_out(snapshot, part)
        self.held = carried if parts.waiting else None
        self.keep_spares(self.ctx.store.snapshot(), carried.state, carried.names, carried.layout)

    def _facts(self, name: str) -> TaskFacts:
        spec = self.ctx.spec(name)
        return TaskFacts(
            in_place=spec.run.recovery == "in_process",
            growing=self.generations.growth(name) is not None,
            usable=spec.is_usable,
            replica_size=spec.replica_size,
            spare_nodes=tuple(s.node for s in self._waiting_spares(name)),
            last_step=spec.run.iterations,
        )

    def _carry_out(self, snapshot: Snapshot, part: Part) -> None:
        """One task's part of the plan: in place where it can, else stop and relaunch."""
        name, move, reason, after = part.decision.task, part.move, part.decision.reason, part.decision.after
        task = snapshot.task(name)
        if move.kind is MoveKind.GROW:
            self._grow(snapshot, name, move.extra, reason)
        elif move.kind is MoveKind.SHRINK and move.shrink is not None:
            self.generations.shrink_planned(snapshot, name, move.shrink, reason)
            if len(move.shrink.kept) < after:
                self.regrow.add(name)  # moved off a drained node: grow back once it has shrunk
        elif move.kind is MoveKind.RESTART:
            grace = self.ctx.limits.stop_grace_s
            self.ctx.act.apply(restart_effects(task, after, reason, grace), self.ctx.clock())
        elif move.kind is MoveKind.LAUNCH:
            self.launch(task, snapshot.next_generation[name], part.wanted, reason)

    def _waiting_spares(self, name: str) -> list[Spare]:
        return [s for s in self.spares.values() if s.task == name and s.used is None]

    def _grow(self, snapshot: Snapshot, name: str, extra: dict[str, int], reason: str) -> None:
        waiting = self._waiting_spares(name)
        offered = [(s.rank, s.node, s.local_rank) for s in waiting]
        used = self.generations.grow(snapshot, name, extra, reason, offered)
        now = self.ctx.clock()
        for s in waiting:
            if s.rank in used:
                s.used = now

    def _record_plan(self, decided: Decided, snapshot: Snapshot) -> None:
        """A plan event for every cluster event answered, and whenever the plan changes a task:
        where it came from, the events it answers (a node by its name, any state: a lost node is
        no longer among the healthy), and what it does (a recovery may have done it already)."""
        tasks = snapshot.tasks
        changes = {
            d.task: [tasks[d.task].workers, d.after]
            for d in decided.plan.decisions
            if d.task in tasks and d.after != tasks[d.task].workers
        }
        unchanged = not changes or decided.plan.allocation() == self.last_plan
        if unchanged and not decided.events:
            return  # nothing to change, or a change already under way, and no event to answer
        self.last_plan = decided.plan.allocation()
        self.ctx.act.record(
            PLAN_EVENT,
            source=decided.source,
            waited_s=round(decided.waited_s, 6) if decided.source == "solved" else None,
            restarts=decided.restarts if decided.source == "solved" else None,
            answers=listed([named(e, _node_names(snapshot)) for e in decided.events]) or None,
            why=decided.why or None,
            seconds=round(decided.seconds, 6),
            allocation=decided.plan.allocation(),
            changes=changes,
            waf=decided.plan.waf,
        )

    def launch(self, task: TaskRecord, generation: int, placement: dict[str, int], reason: str) -> None:
        """A new generation of the task from its checkpoint (the first launch, or a restart):
        its store served first, since the workers' environment names its port."""
        name, now = task.name, self.ctx.clock()
        self.ctx.act.apply((HostStore(name, task.store_port),), now)
        hosted = self.ctx.store.task(name) or task
        env = self.ctx.worker_env(name, generation, sum(placement.values()), hosted.store_port)
        argv = self.ctx.spec(name).run.program
        self.ctx.act.apply(launch_effects(hosted, generation, placement, reason, argv, env), now)

    # ------------------------------------------------------------------ hot spares
    def rebuild_spares(self) -> None:
        """After a restart (or a takeover): the spares still waiting are those the store lists
        (their rows), so that a grow uses them and the plan stops them when it needs their slot."""
        for task in self.ctx.store.tasks(live_only=True):
            for w in self.ctx.store.workers(task.name, SPARE_GENERATION, live=False):
                if w.state is WorkerPhase.SPARE:
                    self.spares[(w.task, w.rank)] = Spare(w.task, w.rank, w.node, w.local_rank, w.launched)

    def keep_spares(
        self, snapshot: Snapshot, state: ClusterState, names: dict[int, str], layout: Assignment
    ) -> None:
        """Stop spares whose slot the plan uses or whose task no longer runs; start spares on
        the slots the plan leaves idle, for the tasks that gain most from them."""
        now = self.ctx.clock()
        planned = {names[n]: sum(per.values()) for n, per in layout.items()}
        healthy = set(names.values())
        self._drop_stale_spares(snapshot, healthy, now)
        waiting = [s for s in self.spares.values() if s.used is None]
        places = [(s.task, s.node) for s in waiting]
        sits = seated(places, self._growth_seats(snapshot, names, layout))
        for i in in_the_way(places, sits, planned, state.gpus_per_node):
            self.drop_spare((waiting[i].task, waiting[i].rank), stop=True)  # the plan needs its slot
        if self.ctx.limits.hot_spares == 0 or not state.tasks:
            return
        kept = [(s, sat) for s, sat in zip(waiting, sits, strict=True) if (s.task, s.rank) in self.spares]
        unseated = Counter(s.node for s, sat in kept if not sat)  # (one seated is counted in ``planned``)
        free = {n: state.gpus_per_node - planned.get(n, 0) - unseated[n] for n in healthy}
        running = {
            n: t.workers
            for n, t in snapshot.tasks.items()
            if t.state is TaskState.RUNNING and self.generations.growth(n) is None
        }
        gains = spare_gains([self.ctx.spec(n) for n in running], running, state.curves)
        have: dict[str, int] = {}
        for s, _ in kept:
            have[s.task] = have.get(s.task, 0) + 1
        homes = {name: {w.node for w in snapshot.live(name)} for name in running}
        for name, node in choose(free, gains, have, homes, self.ctx.limits.hot_spares):
            self._launch_spare(name, node, now)

    def _drop_stale_spares(self, snapshot: Snapshot, healthy: set[str], now: float) -> None:
        """Forget spares renamed long ago (ordinary workers now); drop those on a node out of
        service, and stop those whose task no longer runs."""
        for key, spare in list(self.spares.items()):
            task = snapshot.tasks.get(spare.task)
            if spare.used is not None:
                if now - spare.used > self.ctx.limits.launch_timeout_s:
                    del self.spares[key]
            elif spare.node not in healthy:
                self.drop_spare(key, stop=False)
            elif task is None or not task.state.active:
                self.drop_spare(key, stop=True)

    def _growth_seats(
        self, snapshot: Snapshot, names: dict[int, str], layout: Assignment
    ) -> dict[tuple[str, str], int]:
        """(task, node) -> the newcomers the plan will grow a running task by on that node in
        place (more workers there than it has live): seats its own spares may fill."""
        seats: dict[tuple[str, str], int] = {}
        live_on: dict[str, Counter[str]] = {}  # task -> node -> its live workers there
        for n, per in layout.items():
            for name, count in per.items():
                task, spec = snapshot.tasks.get(name), self.ctx.spec(name)
                if task is None or not task.state.active or spec.run.recovery != "in_process":
                    continue
                if name not in live_on:
                    live_on[name] = Counter(w.node for w in snapshot.live(name))
                here = live_on[name]
                if here and count > here[names[n]]:
                    seats[(name, names[n])] = count - here[names[n]]
        return seats

    def _launch_spare(self, name: str, node: str, now: float) -> None:
        task = self.ctx.store.get_task(name)
        highest = self.ctx.store.max_rank(name, SPARE_GENERATION)
        rank = max(1000, highest + 1 if highest is not None else 1000)
        env = self.ctx.worker_env(name, SPARE_GENERATION, 0, task.store_port, spare=True)
        argv = list(self.ctx.spec(name).run.program)
        launch = Launch(name, SPARE_GENERATION, 0, {node: 1}, rank, argv, env, WorkerPhase.SPARE)
        (added,) = self.ctx.act.launch(launch, now)
        self.spares[(name, rank)] = Spare(name, rank, node, added.local_rank, now)
        self.ctx.act.record("spare_launched", task=name, node=node, rank=rank)

    def spare_list(self) -> list[Spare]:
        return list(self.spares.values())

    def is_spare(self, key: tuple[str, int]) -> bool:
        return key in self.spares

    def stop_spares_of(self, task: str) -> None:
        """The task ended: its waiting spares are stopped with it (not at the next plan), so that
        its end and their stops are on record together."""
        for key, spare in list(self.spares.items()):
            if spare.task == task and spare.used is None:
                self.drop_spare(key, stop=True)

    def drop_spare(self, key: tuple[str, int], stop: bool) -> None:
        spare = self.spares.pop(key, None)
        if spare is None:
            return
        self.ctx.act.drop_spare(spare.task, spare.rank, spare.node, stop)
        self.ctx.act.record("spare_stopped", task=spare.task, node=spare.node, rank=spare.rank)


def _node_names(snapshot: Snapshot) -> dict[int, str]:
    return {n.id: n.name for n in snapshot.nodes.values()}

"""The simulated Unicron: the coordinator's failure decision and planner on the simulated clock,
with recovery modelled as the live system does it.

- Each hit task's failure is decided by the coordinator's own code (``brain/deciding.py:decide``:
  the ladder's ask, counting repeats and node errors, and the cheapest tier at or above it that
  applies, with the node's isolation, ``brain/response.py``), on the simulated cluster as the
  brain sees it (``brainview.py``); the tier carried out is modelled.
- A failed process is recovered *in place*: the survivors rebuild their group without the failed
  replica (detection + one group rebuild + the departed ranks' share of the step in flight, the
  rest of the step's micro-batches kept) and go on shrunk; newcomers start meanwhile (the
  reconfiguration's set-up, ``reconfigure_s``), then take their state from a live replica
  while the members wait (transfer + one rebuild), and the task is whole again. Only when no
  full replica survives does the task restart from its checkpoint (the third tier), with the
  cost model's restart.
- A node lost or isolated is answered by the planner (``plan(state, NodeLost)``, as the
  coordinator's table): hit tasks recover in place as above and grow to what the plan gives
  them; other tasks shrink at a step boundary (one rebuild) or grow with newcomers as above.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from pydantic import Field

from unicron.brain.deciding import Facts, Opened, Seen, decide
from unicron.brain.effects import Isolate, Switch
from unicron.brain.membership import whole_replicas
from unicron.brain.records import NodeRecord
from unicron.core.events import NodeBack, NodeLost
from unicron.core.ladder import Ladder
from unicron.core.settings import Settings
from unicron.core.taxonomy import TAXONOMY, ErrorKind, StateSource
from unicron.core.tiers import Tier
from unicron.planning.placement import Assignment
from unicron.planning.planner import Decision, plan
from unicron.planning.transition import bandwidth, state_source, transition_parts
from unicron.sim.brainview import Views
from unicron.sim.engine import HOUR, Simulation, TaskRun
from unicron.sim.policy_base import CRASH_KINDS, NUMERICAL_KINDS, PolicySettings, held, iteration_s
from unicron.sim.traces import Failure

NEVER = 2**31  # a count no trace reaches
# Wrong numbers the ranks undo in the step (computed again, or an odd replica's state replaced),
# skip, or apply (a spike the data gives), reported as done; each charged ``numerical_steps``.
UNDONE_IN_STEP = frozenset(
    {
        ErrorKind.NUMERICAL_TRANSIENT,
        ErrorKind.NUMERICAL_SKIPPED,
        ErrorKind.GRADIENT_SPIKE,
        ErrorKind.REPLICA_REPAIRED,
    }
)
LIVE = Settings()  # the coordinator's defaults


@dataclass(frozen=True)
class Outcome:
    """What the coordinator's decision carries out for one hit task, as the simulator models it:
    the decision, the workers that go on in place (the new generation's size; 0 when the tier
    is not in place) and those alive in whole replicas after the failure (where a relaunch may
    take its state from; those that go on, when some do)."""

    decided: Opened
    keep: int
    survivors: int

    @property
    def tier(self) -> Tier:
        return self.decided.response.tier


@dataclass(frozen=True)
class Carried:
    """One hit task's answer to a failure: the tier the ladder asked for and the one carried out
    (what the coordinator records as an incident's ``asked`` and ``action``)."""

    time_s: float
    task: str
    kind: ErrorKind
    asked: Tier
    tier: Tier


class UnicronSettings(PolicySettings):
    node_lost_detection_s: float = Field(3.0, ge=0, description="heartbeat deadline")
    crash_detection_s: float = Field(0.5, ge=0, description="process exit or forwarded exception")
    hardware_detection_s: float = Field(1.0, ge=0, description="NVLink, driver, DMA errors raised in-band")
    network_detection_s: float = Field(1.0, ge=0, description="socket errors raised in-band")
    hang_multiple: float = Field(3.0, gt=1, description="hang deadline in mean iteration times")
    numerical_steps: float = Field(
        2.0,
        ge=0,
        description="wrong numbers: the step computed again, then cross-checked, before the verdict "
        "(train/numerics.py), in iteration times; an odd replica's state replaced "
        "(train/replicacheck.py) is charged the same, an assumption (its transfer is not measured)",
    )
    heartbeat_s: float = Field(1.0, ge=0)
    reattempt_failure_probability: float = Field(0.1, ge=0, le=1)
    isolate_after: int = Field(3, ge=1, description="SEV1/SEV2 errors on one node within the window")
    isolate_window_hours: float = Field(24.0, gt=0)
    isolation_hours: float = Field(
        LIVE.isolation_s / HOUR,
        ge=0,
        description="how long a node isolated or reconfigured out stays out: the coordinator's"
        " isolation_s (core/settings.py), which its failure decision isolates for",
    )
    in_place: bool = Field(True, description="survivors recover in process (run.recovery: in_process)")
    seed: int = 0

    def ladder_settings(self) -> Settings:
        """The coordinator's ladder thresholds, with this policy's isolation rule. A trace holds
        the cluster's faults (hardware, network), which a relaunch survives; the limits that fail
        a task (``task_failure_limit``, ``same_fault_limit``) stop a task's own bug from looping,
        which no trace holds, so here they never fail one."""
        return Settings(
            escalation_window_s=self.isolate_window_hours * HOUR,
            isolate_after=self.isolate_after,
            isolation_s=self.isolation_hours * HOUR,
            task_failure_limit=NEVER,
            same_fault_limit=NEVER,
        )


class UnicronPolicy:
    name = "unicron"
    efficiency = 1.0  # the paper: failure-free throughput equal to Megatron's
    tensor_parallel = True
    elastic = False

    def __init__(self, settings: UnicronSettings | None = None) -> None:
        self.s = settings or UnicronSettings()
        self.rng = random.Random(self.s.seed)
        self.ladder = Ladder(self.s.ladder_settings())
        self.regrowing: dict[str, int] = {}  # task -> the count its newcomers bring it back to
        self.carried: list[Carried] = []  # every hit task's tier, in order (the incidents' log)
        self.views = Views(slots=0)  # the cluster as the brain sees it (``start``: the nodes' slots)

    def start(self, sim: Simulation) -> None:
        self.views = Views(slots=sim.cluster.gpus_per_node)

    def detection_s(self, sim: Simulation, kind: ErrorKind, run: TaskRun | None) -> float:
        if kind is ErrorKind.NODE_LOST:
            return self.s.node_lost_detection_s
        iteration = iteration_s(sim, run) if run is not None else 0.0
        if kind in (ErrorKind.TASK_HANG, ErrorKind.NCCL_TIMEOUT):
            return self.s.hang_multiple * iteration + self.s.heartbeat_s
        if kind in NUMERICAL_KINDS or kind in UNDONE_IN_STEP:  # found in the step it strikes
            return self.s.numerical_steps * iteration
        if kind in CRASH_KINDS:
            return self.s.crash_detection_s
        if TAXONOMY[kind].tier is Tier.RECONFIGURE:
            return self.s.hardware_detection_s
        return self.s.network_detection_s

    # ------------------------------------------------------------------ the ladder
    def on_failure(self, sim: Simulation, failure: Failure, hit: Mapping[str, int]) -> None:
        """The coordinator's own failure decision (``brain/deciding.py:decide``) for each hit
        task, on the simulated cluster as the brain sees it (``brainview.py``): the ladder asks,
        the cheapest tier at or above that applies is carried out (``brain/response.py``), and
        that tier, with the node's isolation if the response isolates it, is modelled."""
        if failure.kind in UNDONE_IN_STEP:
            # The ranks undid it (or skipped the step) in the step itself and reported it: the
            # coordinator records it and decides nothing, nor counts it (``passing_fault``).
            for name in hit:
                sim.pause(name, [(self.detection_s(sim, failure.kind, sim.tasks[name]), "detection")])
            return
        out = failure.node not in sim.healthy  # the engine took it out for repair: its GPUs are gone
        nodes = self.views.nodes(sim.cluster.nodes, sim.healthy, failure.node, out)
        outcomes = {name: self._decide(sim, name, failure, hit[name], out, nodes) for name in sorted(hit)}
        effects = [e for o in outcomes.values() for e in o.decided.response.effects]
        isolated = [e for e in effects if isinstance(e, Isolate)]
        if isolated and failure.node in sim.healthy:
            # Out until an operator resumes it (a device fault): until the trace's repair is done.
            until = isolated[0].until
            sim.take_out(failure.node, sim.now + failure.repair_hours * HOUR if until is None else until)
        for name, o in outcomes.items():
            self.ladder.carried(name, o.tier, sim.now)
            self.carried.append(Carried(sim.now, name, failure.kind, o.decided.asked.tier, o.tier))
        if any(o.tier is Tier.RECONFIGURE for o in outcomes.values()):
            self._reconfigure(sim, failure, hit, outcomes)  # the planner answers for every task there
            return
        for name, o in outcomes.items():
            run = sim.tasks[name]
            if o.tier is Tier.REATTEMPT:
                detect = self.detection_s(sim, failure.kind, run)
                sim.pause(name, [(detect, "detection"), (self._rebuild_s(sim), "restart")], replace=True)
            else:  # restart failed in place, or from the checkpoint, as decided
                self._recover(sim, name, o, failure.kind, self.regrowing.get(name, run.gpus))

    def _decide(
        self,
        sim: Simulation,
        name: str,
        failure: Failure,
        lost_gpus: int,
        out: bool,
        nodes: Mapping[str, NodeRecord],
    ) -> Outcome:
        """What the coordinator decides for ``name``; a reattempt that fails again is another
        incident of the same kind, which the ladder escalates after max_reattempts."""
        running = sim.tasks[name].gpus + (lost_gpus if out else 0)  # (the engine took them off)
        view = self.views.failure
        snapshot, seen = view(
            name, failure.kind, failure.node, lost_gpus, out, sim.assignment, nodes, running
        )
        before = len(snapshot.live(name))
        facts = Facts(
            in_process=self.s.in_place,
            growing=False,
            usable=lambda gpus: sim.usable(name, gpus),
            replica_size=self._replica(sim, name, before),
        )
        task, attributed = snapshot.task(name), Seen(seen, failure.kind, TAXONOMY[failure.kind].scope)
        while True:
            decided = decide(
                task, attributed, (), self.ladder, lambda: snapshot, facts, self.ladder.settings, sim.now
            )
            assert isinstance(decided, Opened)  # (no incident is open: each is carried out at once)
            self.ladder.count(decided.asked.counted)
            if decided.asked.tier is not Tier.REATTEMPT:
                break
            if self.rng.random() >= self.s.reattempt_failure_probability:
                break
            self.ladder.carried(name, Tier.REATTEMPT, sim.now)
        switched = [e for e in decided.response.effects if isinstance(e, Switch)]
        keep = switched[0].membership.world_size if switched and decided.response.tier.in_place else 0
        if keep:  # (the members going on hold the state; counting every survivor was dear at scale)
            return Outcome(decided, keep, keep)
        healthy, gone = snapshot.healthy(), seen.failed or frozenset()
        alive = [w for w in snapshot.live(name) if w.rank not in gone and w.node in healthy]
        return Outcome(decided, 0, len(whole_replicas(alive, facts.replica_size)))

    def _reconfigure(
        self, sim: Simulation, failure: Failure, hit: Mapping[str, int], outcomes: Mapping[str, Outcome]
    ) -> None:
        """The node left (isolated by the decision, or out for repair): the planner's plan for
        its loss, each hit task recovering as decided."""
        node = failure.node
        before: Assignment = {n: dict(t) for n, t in sim.assignment.items()}
        before[node] = dict(hit)
        state = sim.planner_state(tuple(sorted(sim.healthy | {node})), before)
        self._carry_out(sim, plan(state, NodeLost(node)).decisions, outcomes, failure.kind)

    def on_repair(self, sim: Simulation, node: int) -> None:
        state = sim.planner_state(tuple(sorted(sim.healthy - {node})))
        self._carry_out(sim, plan(state, NodeBack(node)).decisions, {}, None)

    # ------------------------------------------------------------------ carrying a plan out
    def _carry_out(
        self,
        sim: Simulation,
        decisions: Sequence[Decision],
        hit: Mapping[str, Outcome],
        kind: ErrorKind | None,
    ) -> None:
        sim.set_allocation({d.task: d.after for d in decisions})
        for d in decisions:
            run = sim.tasks[d.task]
            if d.task in hit and kind is not None:
                self._recover(sim, d.task, hit[d.task], kind, d.after, planned_before=d.before)
            elif d.after > d.before > 0 and self.s.in_place:
                self._grow(sim, d.task, d.before, d.after)
            elif 0 < d.after < d.before and self.s.in_place:
                sim.pause(d.task, [(self._rebuild_s(sim), "restart")])  # shrink at a step boundary
            elif d.after != d.before and d.after > 0:
                self._relaunch(sim, run, d.before, d.after, survivors=d.before, failed=False)

    def _recover(
        self,
        sim: Simulation,
        name: str,
        outcome: Outcome,
        kind: ErrorKind,
        target: int,
        planned_before: int | None = None,
    ) -> None:
        """A failed process (or node) of ``name``, recovered as decided: in place (the new
        generation's members, as many as ``target`` allows at a usable size), then grown back to
        ``target`` with newcomers; else restarted from the checkpoint."""
        run = sim.tasks[name]
        before = planned_before if planned_before is not None else run.gpus
        detect = self.detection_s(sim, kind, run)
        keep = sim.largest_usable(name, min(outcome.keep, target))
        if keep == 0 or target == 0:
            if target > 0:
                survivors = outcome.survivors
                self._relaunch(sim, run, before, target, survivors=survivors, failed=True, detect=detect)
            return
        share = (before - keep) / before
        lost = sim.cluster.planner.transition.lost_iteration_fraction * iteration_s(sim, run) * share
        parts = [(detect, "detection"), (self._rebuild_s(sim), "restart"), (lost, "lost_work")]
        sim.pause(name, parts, replace=True)  # (a recovery under way starts over)
        if keep < target:
            self._grow(sim, name, keep, target)

    def _grow(self, sim: Simulation, name: str, running: int, target: int) -> None:
        """Newcomers launch while the task runs on ``running``; then they take their state from a
        live replica while the members wait, and the task runs on ``target``."""
        run = sim.tasks[name]
        self.regrowing[name] = target
        resumes = run.down_until(sim.now)  # (a pause under way is lost at the count it held)

        def shrunk() -> None:
            if self.regrowing.get(name) == target:
                run.gpus = running  # the other slots are held for the newcomers

        sim.call_at(resumes, shrunk)
        # Newcomers start and join: the reconfiguration's set-up, while the members train.
        ready = resumes + sim.cluster.planner.transition.reconfigure_s

        def joined() -> None:
            if self.regrowing.get(name) != target or held(sim, name) != target:
                return  # a later plan changed the task meanwhile
            del self.regrowing[name]
            run.gpus = target
            sim.pause(name, [(self._transfer_s(sim, name, target) + self._rebuild_s(sim), "restart")])

        sim.call_at(ready, joined)

    def _relaunch(
        self,
        sim: Simulation,
        run: TaskRun,
        before: int,
        after: int,
        survivors: int,
        failed: bool,
        detect: float = 0.0,
    ) -> None:
        """Stop and relaunch (a start from nothing, a move in place cannot express, or no full
        replica left): the cost model's transition, state from the nearest source."""
        curve = sim.reference[run.spec.name]
        parts = transition_parts(
            sim.cluster.planner.transition,
            before=curve.evaluate(np.array([before], dtype=np.int64)),
            after=curve.evaluate(np.array([after], dtype=np.int64)),
            survivors=survivors,
            failed=failed,
            detection_s=detect,
            tier=Tier.FROM_CHECKPOINT if failed else Tier.RECONFIGURE,
        )
        self.regrowing.pop(run.spec.name, None)
        run.gpus = after
        sim.pause(
            run.spec.name,
            [
                (float(parts.detection[0]), "detection"),
                (float(parts.setup[0] + parts.state[0]), "restart"),
                (float(parts.lost_work[0]), "lost_work"),
            ],
            replace=failed,  # (a failure's relaunch starts over what was under way)
        )

    # ------------------------------------------------------------------ small parts
    @staticmethod
    def _rebuild_s(sim: Simulation) -> float:
        """Survivors re-form their process group (the reattempt's set-up)."""
        return sim.cluster.planner.transition.reattempt_s

    @staticmethod
    def _replica(sim: Simulation, name: str, gpus: int) -> int:
        points = sim.reference[name].evaluate(np.array([max(gpus, 1)], dtype=np.int64))
        return max(int(points.replica_gpus[0]), 1)

    def _transfer_s(self, sim: Simulation, name: str, gpus: int) -> float:
        points = sim.reference[name].evaluate(np.array([gpus], dtype=np.int64))
        source = state_source(gpus, int(points.replica_gpus[0]))
        if source is StateSource.PERSISTENT_CHECKPOINT:
            source = StateSource.OTHER_NODE_REPLICA  # newcomers join live members: a replica exists
        return float(points.state_bytes_per_gpu[0]) / bandwidth(sim.cluster.planner.transition, source)

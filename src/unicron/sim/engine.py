"""The discrete-event engine: replays a failure trace against one policy.

The engine owns what the trace decides: which nodes are in service (a failure whose kind needs a
repair takes its node out until ``repair_hours`` later) and which tasks a failure hits (those
with workers on the node). The policy owns what the system decides: how long each hit task is
down and why, and how GPUs are divided afterwards.

Accounting. Between events every task either runs or is in a down segment (detection, restart,
lost work, waiting for repair). Its *potential* rate is what a Megatron-grade system would get
from its GPUs (the reference curve); a running task achieves the policy's own rate, the
difference being the policy's failure-free overhead; a down task loses its potential to the
segment's cause. What remains between the oracle's ideal (the optimal plan for the healthy
capacity at every moment, with no downtime) and all of that is sub-healthy running: an
allocation worse than the optimum. So for every policy:

    ideal = achieved + overhead + detection + restart + lost_work + repair_wait + sub_healthy
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np

from unicron.core.specs import ClusterSpec, TaskSpec
from unicron.core.taxonomy import TAXONOMY
from unicron.planning.placement import Assignment, CarriedPlacement
from unicron.planning.planner import ClusterState, plan
from unicron.planning.throughput import AnalyticCurve, ThroughputCurve, curve_for
from unicron.sim.traces import Failure

HOUR = 3600.0
CAUSES = ("detection", "restart", "lost_work", "repair_wait", "overhead", "sub_healthy")
DOWN_CAUSES = ("detection", "restart", "lost_work", "repair_wait")


class Policy(Protocol):
    """How a system reacts. Implementations live in ``unicron.sim.policies``."""

    name: str
    efficiency: float  # failure-free throughput multiplier on top of the curve
    tensor_parallel: bool  # False: the system's curve uses layouts without tensor parallelism
    elastic: bool  # True: runs at any count, scaling its rate with the GPUs it has

    def start(self, sim: Simulation) -> None: ...
    def on_failure(self, sim: Simulation, failure: Failure, hit: Mapping[str, int]) -> None: ...
    def on_repair(self, sim: Simulation, node: int) -> None: ...


@dataclass
class TaskRun:
    spec: TaskSpec
    nominal: int = 0  # the count the task was planned at (elastic rates scale from it)
    gpus: int = 0
    segments: list[tuple[float, str]] = field(default_factory=list)  # (end s, cause), in order
    waiting_rate: float | None = None  # potential while waiting, when not that of its GPUs
    achieved: float = 0.0
    lost: dict[str, float] = field(default_factory=lambda: dict.fromkeys(CAUSES, 0.0))

    def down_until(self, now: float) -> float:
        return max([now, *(end for end, _ in self.segments)])


@dataclass
class PolicyResult:
    policy: str
    waf_flop: float
    ideal_flop: float
    lost_flop: dict[str, float]
    task_flop: dict[str, float]
    timeline_hours: list[float]
    timeline_waf: list[float]  # mean cluster WAF (FLOP/s) over each sample interval
    failures: int
    ratio_to_oracle: float | None = None  # set by the runner; None: the policy did not run
    # Tasks the policy cannot run on the GPUs the plan gives them (its rate there is 0), and why.
    cannot_run: dict[str, str] = field(default_factory=dict)
    planned: int = 0  # tasks the plan for the full cluster gives GPUs

    @property
    def did_not_run(self) -> str | None:
        """Why the policy achieved nothing at all, when it could run none of the planned tasks;
        None when it ran (a ratio of 0 would read as a policy that ran and lost everything)."""
        if self.planned == 0:
            return "the plan for the full cluster gives no task a GPU"
        if self.waf_flop > 0 or len(self.cannot_run) < self.planned:
            return None
        return "; ".join(self.cannot_run.values())


class Simulation:
    """One policy on one trace. Policies call the helper methods below."""

    def __init__(
        self,
        cluster: ClusterSpec,
        tasks: list[TaskSpec],
        failures: list[Failure],
        policy: Policy,
        hours: float,
        samples: int = 400,
    ) -> None:
        self.cluster = cluster
        self.policy = policy
        self.horizon = hours * HOUR
        self.now = 0.0
        self.healthy: set[int] = set(range(cluster.nodes))
        self.assignment: Assignment = {}  # changed only by set_allocation and take_out
        self._held = {t.name: 0 for t in tasks}  # task -> GPUs in the assignment, kept with it
        self._placing = CarriedPlacement()  # (its rows are the assignment's: changed by nothing else)
        self.tasks = {t.name: TaskRun(t) for t in tasks}
        gpu = cluster.gpu_type()
        self.reference = {t.name: curve_for(t, gpu, cluster.gpus_per_node) for t in tasks}
        self.own: dict[str, ThroughputCurve] = {}
        for t in tasks:
            base = self.reference[t.name]
            if not policy.tensor_parallel and t.model is not None:
                base = AnalyticCurve(t.model, gpu, cluster.gpus_per_node, max_tensor=1)
            self.own[t.name] = base
        self._rates: dict[tuple[str, str, int], float] = {}
        self._largest: dict[tuple[str, int], int] = {}
        self._ideal: dict[int, tuple[float, dict[str, int]]] = {}
        self._queue: list[tuple[float, int, str, object]] = []
        self._seq = itertools.count()
        self.failures = [f for f in failures if f.time_hours * HOUR < self.horizon]
        for f in self.failures:
            self.schedule(f.time_hours * HOUR, "failure", f)
        for k in range(1, samples + 1):
            self.schedule(self.horizon * k / samples, "sample", None)
        self.ideal_flop = 0.0
        self.sub_healthy = 0.0
        self.timeline: list[tuple[float, float]] = [(0.0, 0.0)]

    # ------------------------------------------------------------------ rates
    def _curve_rate(self, which: str, task: str, gpus: int) -> float:
        key = (which, task, gpus)
        if key not in self._rates:
            curve = self.reference[task] if which == "ref" else self.own[task]
            self._rates[key] = float(curve.evaluate(np.array([gpus], dtype=np.int64)).rate[0])
        return self._rates[key]

    def _rate(self, which: str, run: TaskRun, gpus: int) -> float:
        if gpus <= 0:
            return 0.0
        rate = self._curve_rate(which, run.spec.name, gpus)
        if rate == 0.0 and self.policy.elastic and run.nominal > 0:
            # Elastic systems run at any count: scale the rate at the planned count.
            rate = self._curve_rate(which, run.spec.name, run.nominal) * gpus / run.nominal
        return run.spec.weight * rate

    def potential(self, run: TaskRun, gpus: int | None = None) -> float:
        """Weighted FLOP/s a Megatron-grade system would get from these GPUs."""
        return self._rate("ref", run, run.gpus if gpus is None else gpus)

    def achievable(self, run: TaskRun) -> float:
        return self._rate("own", run, run.gpus) * self.policy.efficiency

    def usable(self, task: str, gpus: int) -> bool:
        return gpus > 0 and self._curve_rate("ref", task, gpus) > 0

    def largest_usable(self, task: str, at_most: int) -> int:
        """The most GPUs, at most ``at_most``, that ``task`` can run on (0: none); memoised, as
        policies ask it at every failure (a scan down from 16,000 GPUs was most of a 16,384-GPU
        scenario's time)."""
        key = (task, at_most)
        if key not in self._largest:
            self._largest[key] = next((c for c in range(at_most, 0, -1) if self.usable(task, c)), 0)
        return self._largest[key]

    def ideal(self, nodes: int | None = None) -> tuple[float, dict[str, int]]:
        """The optimal WAF and allocation for ``nodes`` healthy nodes (memoised)."""
        count = len(self.healthy) if nodes is None else nodes
        if count not in self._ideal:
            state = self.planner_state(healthy=tuple(range(count)), assignment={})
            best = plan(state)
            self._ideal[count] = (best.waf, best.allocation())
        return self._ideal[count]

    def planner_state(
        self,
        healthy: tuple[int, ...] | None = None,
        assignment: Mapping[int, Mapping[str, int]] | None = None,
    ) -> ClusterState:
        return ClusterState(
            self.cluster.gpus_per_node,
            self.cluster.gpu_type(),
            self.cluster.node_mtbf_hours,
            self.cluster.planner,
            tuple(sorted(self.healthy)) if healthy is None else healthy,
            self.assignment if assignment is None else assignment,
            tuple(r.spec for r in self.tasks.values()),
            self.reference,
            next_node=self.cluster.nodes,
        )

    # ------------------------------------------------------------------ helpers for policies
    def schedule(self, at: float, kind: str, payload: object) -> None:
        heapq.heappush(self._queue, (at, next(self._seq), kind, payload))

    def call_at(self, at: float, action: Callable[[], None]) -> None:
        self.schedule(at, "call", action)

    def pause(self, task: str, parts: list[tuple[float, str]], replace: bool = False) -> None:
        """Take a task down for consecutive (seconds, cause) parts, after any current downtime;
        ``replace``: from now, what was still to come of it dropped. A failure's recovery
        replaces (a failure during a restart starts it over: what the first had left to do is
        not done, so not charged); a plan's change (a grow, a rejoin) queues after it."""
        run = self.tasks[task]
        if replace:
            run.segments = [(e, c) for e, c in run.segments if e <= self.now]
        start = run.down_until(self.now)
        for seconds, cause in parts:
            if seconds > 0:
                start += seconds
                run.segments.append((start, cause))

    def set_allocation(self, counts: Mapping[str, int]) -> None:
        """Give tasks these counts, moving as few workers as possible."""
        counts = {t: counts.get(t, 0) for t in self.tasks}
        held = {t: self.held(t) for t in self.tasks}
        # Every task at its count already, on nodes in service: the placement would keep every
        # worker where it is (single workers kept up to their count), in the same node order (the
        # assignment is a placement's, less nodes taken out), so it is not made again: a quarter
        # of a 16,384-GPU scenario's events answer so, and each placement reads every node.
        if counts != held or not self.healthy.issuperset(self.assignment):
            nodes, gpus_per_node = sorted(self.healthy), self.cluster.gpus_per_node
            self.assignment = self._placing.place(counts, nodes, gpus_per_node, self.assignment)
            self._held = counts  # (a placement gives each task its count)
        for name, run in self.tasks.items():
            if counts[name] != held[name] or run.gpus > counts[name]:
                run.gpus = counts[name]

    def held(self, task: str) -> int:
        """GPUs ``task`` holds in the assignment: kept as it changes (a policy asks at each event,
        for each task, and reading every node each time was a tenth of a 16,384-GPU scenario's
        time)."""
        return self._held[task]

    def free_gpus(self) -> int:
        return len(self.healthy) * self.cluster.gpus_per_node - sum(self._held.values())

    def take_out(self, node: int, until: float) -> dict[str, int]:
        """Put a node out of service until ``until``; returns the GPUs each task lost there."""
        lost = dict(self.assignment.pop(node, {}))
        if node in self.healthy:
            self.healthy.discard(node)
            self.schedule(until, "repair", node)
        for name, gpus in lost.items():
            self.tasks[name].gpus -= gpus
            self._held[name] -= gpus
        return lost

    # ------------------------------------------------------------------ the loop
    def _advance(self, to: float) -> None:
        span = to - self.now
        if span <= 0:
            return
        ideal_rate, _ = self.ideal()
        self.ideal_flop += ideal_rate * span
        for run in self.tasks.values():
            running = self.potential(run)
            downtime = run.waiting_rate if run.waiting_rate is not None else running
            cursor = self.now
            kept = []
            for end, cause in run.segments:
                if end <= cursor:
                    continue
                stop = min(end, to)
                run.lost[cause] += downtime * (stop - cursor)
                cursor = stop
                if end > to:
                    kept.append((end, cause))
            run.segments = kept
            if not kept:
                run.waiting_rate = None
            if to > cursor:
                achieved = self.achievable(run)
                run.achieved += achieved * (to - cursor)
                run.lost["overhead"] += max(running - achieved, 0.0) * (to - cursor)
        self.now = to

    def run(self, progress: Callable[[float], None] | None = None) -> PolicyResult:
        """Replay the trace; ``progress`` is told the simulated hours reached after each event."""
        self.set_allocation(self.ideal()[1])
        for run in self.tasks.values():
            run.nominal = run.gpus
        cannot = {n: self._why_not(r) for n, r in self.tasks.items() if r.nominal and not self.achievable(r)}
        self.policy.start(self)
        while self._queue:
            at, _, kind, payload = heapq.heappop(self._queue)
            if at > self.horizon:
                break
            if progress is not None:
                progress(at / HOUR)
            self._advance(at)
            if kind == "failure":
                assert isinstance(payload, Failure)
                self._failure(payload)
            elif kind == "repair":
                assert isinstance(payload, int)
                self.healthy.add(payload)
                self.policy.on_repair(self, payload)
            elif kind == "call":
                assert callable(payload)
                payload()
            else:
                self.timeline.append((self.now, sum(r.achieved for r in self.tasks.values())))
        self._advance(self.horizon)
        result = self._result()
        result.cannot_run = cannot
        result.planned = sum(1 for r in self.tasks.values() if r.nominal)
        return result

    def _why_not(self, run: TaskRun) -> str:
        """Why this policy has no throughput for ``run`` on the GPUs the plan gives it."""
        name, gpus, policy, model = run.spec.name, run.nominal, self.policy.name, run.spec.model
        if not self.policy.tensor_parallel and model is not None and self.potential(run, gpus) > 0:
            gpu = self.cluster.gpu_type()
            roomy = AnalyticCurve(
                model, replace(gpu, memory_bytes=math.inf), self.cluster.gpus_per_node, max_tensor=1
            )
            if roomy.evaluate(np.array([gpus], dtype=np.int64)).rate[0] > 0:
                return (
                    f"{name} does not fit in a GPU's memory ({gpu.memory_bytes / 2**30:.0f} GiB) "
                    f"on {gpus:,} GPUs without tensor parallelism, which {policy} does not use"
                )
            return (
                f"{name} has no layout on {gpus:,} GPUs without tensor parallelism, "
                f"which {policy} does not use"
            )
        return f"{name} has no throughput under {policy} on the {gpus:,} GPUs the plan gives it"

    def _failure(self, failure: Failure) -> None:
        if failure.node not in self.healthy:
            return  # already out of service: nothing more to lose there
        hit = dict(self.assignment.get(failure.node, {}))
        if TAXONOMY[failure.kind].needs_repair:
            self.take_out(failure.node, self.now + failure.repair_hours * HOUR)
        self.policy.on_failure(self, failure, hit)

    def _result(self) -> PolicyResult:
        lost = dict.fromkeys(CAUSES, 0.0)
        for run in self.tasks.values():
            for cause, value in run.lost.items():
                lost[cause] += value
        achieved = sum(r.achieved for r in self.tasks.values())
        remainder = self.ideal_flop - achieved - sum(v for k, v in lost.items() if k != "sub_healthy")
        # Summation noise can leave a remainder of -1e-12 of the ideal: that is zero.
        lost["sub_healthy"] = 0.0 if abs(remainder) <= 1e-9 * self.ideal_flop else remainder
        hours, waf = [], []
        for (t0, c0), (t1, c1) in itertools.pairwise(self.timeline):
            if t1 > t0:
                hours.append(t1 / HOUR)
                waf.append((c1 - c0) / (t1 - t0))
        return PolicyResult(
            self.policy.name,
            achieved,
            self.ideal_flop,
            lost,
            {n: r.achieved for n, r in self.tasks.items()},
            hours,
            waf,
            len(self.failures),
        )

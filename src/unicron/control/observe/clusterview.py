"""The cluster as an operator watches it: one consistent reading, built on demand, for the
Prometheus scrape (``metrics.py``) and the dashboard (``dashboard.py``).

Nothing here decides anything; it reads the store and the coordinator's parts: where every
task's workers and hot spares sit, each task's measured, planned and achieved throughput, the
cluster's WAF against the best the planner could do with every registered node healthy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from unicron.brain.records import NodeRecord, TaskRecord
from unicron.control.context import Context
from unicron.control.detect.nodewatch import Holding
from unicron.control.observe.wafhistory import WafHistory, WafPoint
from unicron.control.place.placing import Placer
from unicron.control.place.rates import RateMeter
from unicron.core.livespecs import LiveTaskSpec
from unicron.planning.planner import plan

NOT_HOLDING = Holding(by_hand=False, alarm=None, domains=(), nodes=0)


@dataclass(frozen=True)
class Slot:
    task: str | None  # None: idle
    spare: bool = False


@dataclass(frozen=True)
class TaskView:
    record: TaskRecord
    spec: LiveTaskSpec
    measured_flops: float | None  # FLOP/s at its current size, as measured (None: not yet)
    planned_waf: float | None  # weighted FLOP/s the current plan expects of it
    achieved_waf: float  # weighted FLOP/s over the last window (``wafhistory.py``)

    @property
    def replicas(self) -> int:
        return self.record.workers // max(1, self.spec.replica_size)


@dataclass(frozen=True)
class ClusterView:
    time: float
    nodes: tuple[NodeRecord, ...]
    slots: dict[str, tuple[Slot, ...]]  # node -> its slots, in order
    tasks: tuple[TaskView, ...]
    waf: float  # achieved, the whole cluster
    planned_waf: float | None  # the current plan's
    optimum_waf: float | None  # the plan's with every registered node healthy
    open_incidents: int
    plan_counts: dict[str, int] = field(default_factory=dict)  # "table", "solved", "rebuilds"
    late_s: float = 0.0  # how late the coordinator itself has been over a heartbeat deadline
    store_behind_s: float = 0.0  # how long the oldest change not yet durable has waited
    holding: Holding = NOT_HOLDING  # what holds node losses back now


@dataclass
class Viewer:
    """Builds ``ClusterView``s from the coordinator's parts; caches the healthy-capacity
    optimum (a plan) until the cluster's nodes, tasks or measurements change."""

    ctx: Context
    placer: Placer
    rates: RateMeter
    history: WafHistory
    open_incidents: Callable[[], int]
    late_s: Callable[[float], float] = lambda now: 0.0  # the coordinator's own lateness at ``now``
    store_behind_s: Callable[[], float] = lambda: 0.0  # its store's write lag (``journal.py``)
    holding: Callable[[], Holding] = lambda: NOT_HOLDING  # what holds node losses back
    _optimum: tuple[tuple[Any, ...], float | None] | None = None

    def view(self) -> ClusterView:
        store, now = self.ctx.store, self.ctx.clock()
        nodes = tuple(store.nodes())
        latest = self.history.latest() or WafPoint(now, {})
        live = store.tasks(live_only=True)
        current = self.placer.last_decided if live else None  # no task left: no plan in force
        decided = {d.task: d.waf_after for d in current.decisions} if current is not None else {}
        tasks = tuple(
            TaskView(
                t,
                self.ctx.spec(t.name),
                self.rates.used.get(t.name, {}).get(t.workers),
                decided.get(t.name),
                latest.tasks.get(t.name, 0.0),
            )
            for t in store.tasks()
        )
        return ClusterView(
            time=now,
            nodes=nodes,
            slots=self._slots(nodes),
            tasks=tasks,
            waf=latest.cluster,
            planned_waf=current.waf if current is not None else None,
            optimum_waf=self._optimum_waf(),
            open_incidents=self.open_incidents(),
            plan_counts=dict(self.placer.allocator.counts),
            late_s=self.late_s(now),
            store_behind_s=self.store_behind_s(),
            holding=self.holding(),
        )

    def _slots(self, nodes: tuple[NodeRecord, ...]) -> dict[str, tuple[Slot, ...]]:
        held = self.ctx.store.held_slots()
        spares: dict[str, list[str]] = {}
        for spare in self.placer.spare_list():
            if spare.used is None:
                spares.setdefault(spare.node, []).append(spare.task)
        slots = {}
        for n in nodes:
            taken = [Slot(task) for task, count in sorted(held.get(n.name, {}).items()) for _ in range(count)]
            taken += [Slot(task, spare=True) for task in sorted(spares.get(n.name, []))]
            slots[n.name] = tuple([*taken, *[Slot(None)] * max(0, n.slots - len(taken))])
        return slots

    def _optimum_waf(self) -> float | None:
        """The WAF of the plan for every registered node healthy (lost, isolated and draining
        ones included), planned from scratch: what the cluster would achieve at its full healthy
        capacity. From scratch, as the simulator's oracle plans (``sim/engine.py:ideal``): planned
        from where the workers are, moving them costs, and the "optimum" fell below the plan in
        force."""
        snapshot = self.ctx.store.snapshot()
        state, _ = self.placer.cluster_state(snapshot)
        if not state.tasks:
            return None
        every = tuple(sorted(n.id for n in snapshot.nodes.values()))
        key = (every, tuple(t.name for t in state.tasks), self.rates.version)
        if self._optimum is None or self._optimum[0] != key:
            try:
                self._optimum = (key, plan(replace(state, healthy=every, assignment={})).waf)
            except Exception:  # a cluster the planner cannot divide (e.g. replicas that fit no node)
                self._optimum = (key, None)
        return self._optimum[1]

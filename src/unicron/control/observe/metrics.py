"""The coordinator's Prometheus metrics (served at ``/metrics``).

Two kinds, in one registry of its own (several coordinators may live in one test process):

- what happens (counters and histograms), fed by the events the coordinator records as they
  are recorded (``Applier.listeners``): incidents by kind and severity, the recovery tiers
  carried out, the time from a fault to
  its detection, from detection to the decision, from the decision to the end of the transition
  (the first step after the fault began), the task's downtime, the micro-batches and steps the
  failures cost, plan decisions by source and their time;
- what is (gauges), read from a ``clusterview.ClusterView`` at each scrape: each task's state,
  workers, replicas, step, measured, planned and achieved throughput; the cluster's WAF, its
  plan's and its healthy-capacity optimum; each node's state, slots and heartbeat age; the
  incidents still open; plan-table lookups, solves and rebuilds.

Names follow Prometheus' conventions: ``unicron_`` prefix, base units (seconds, FLOP/s as
``_flops``), ``_total`` for counters. ``deploy/grafana/unicron.json`` is built on them.

Every name a panel plots is served by an idle coordinator too, so that a panel shows 0 rather
than "No data" (Prometheus' "avoid missing metrics"): counters from zero, for every label value
known in advance (each kind with its severity, each tier, each plan source and outcome) and, for
those per task, for every task the coordinator knows; the cluster's gauges at their value, 0
where nothing runs. Per-task gauges: see ``_task_gauges``.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from unicron.control.observe.clusterview import ClusterView, TaskView
from unicron.core.states import NodeState, TaskState
from unicron.core.taxonomy import TAXONOMY
from unicron.core.tiers import Tier

# From a sub-second in-place recovery to a relaunch that waits for a collective timeout.
SECONDS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0)
FAST = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0)  # decisions
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LABELS = frozenset(t.label for t in Tier)
PLAN_SOURCES = ("table", "solved")  # a plan looked up in the table, or solved
PLAN_OUTCOMES = {"table": "lookup", "solved": "solve", "rebuilds": "rebuild"}  # ClusterView.plan_counts


class Metrics:
    def __init__(self, view: Callable[[], ClusterView]) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        count = partial(Counter, registry=r)
        seconds = partial(Histogram, registry=r, buckets=SECONDS)
        self.incidents = count(
            "unicron_incidents", "Incidents opened, by error kind and severity", ["kind", "severity"]
        )
        for kind, info in TAXONOMY.items():  # from zero: a kind's severity is fixed by the taxonomy
            self.incidents.labels(kind.value, info.severity.name)
        self.tiers = count(
            "unicron_recovery_tiers",
            "Recovery tiers carried out (an incident's, then each escalation's), by tier",
            ["tier"],
        )
        for tier in Tier:  # exported from zero: a panel shows every tier, also before its first
            self.tiers.labels(tier.label)
        self.detection = seconds(
            "unicron_detection_seconds", "From a fault (injected or first seen) to its detection"
        )
        self.decision = seconds(
            "unicron_decision_seconds",
            "From an incident's detection to its response carried out",
            buckets=FAST,
        )
        self.transition = seconds(
            "unicron_transition_seconds", "From the response to the end of the transition (computing resumed)"
        )
        self.downtime = seconds("unicron_downtime_seconds", "A task's downtime per recovered incident")
        self.lost_micro_batches = count(
            "unicron_lost_micro_batches", "Micro-batches recomputed for ranks that left a step", ["task"]
        )
        self.lost_steps = count(
            "unicron_lost_steps", "Completed steps trained again after a restart from a checkpoint", ["task"]
        )
        self.plan_seconds = seconds(
            "unicron_plan_decision_seconds", "Time to decide a plan, by source", ["source"], buckets=FAST
        )
        for source in PLAN_SOURCES:
            self.plan_seconds.labels(source)
        self.mass_silence = Gauge(
            "unicron_mass_silence",
            "1 while a mass silence, or the coordinator's own heartbeat lag, holds node losses back"
            " (control/detect/silence.py), else 0",
            registry=r,
        )
        self.domain_silence = Gauge(
            "unicron_domain_silence",
            "1 while a failure domain is partly silent and its nodes' losses are held, by domain",
            ["domain"],
            registry=r,
        )
        self.losses_held = count(
            "unicron_node_losses_held", "Silent nodes not declared lost, by why", ["why"]
        )
        for why in (
            "mass silence",
            "coordinator behind",
            "domain silence",
            "node loss rate spent",
            "held by hand",
        ):
            self.losses_held.labels(why)
        self.decided_at: dict[int, float] = {}  # open incidents' decision times, for the transition
        self.steps_at: dict[int, tuple[str, int]] = {}  # open incidents' task and step at detection
        self._state = _State(view)
        self._scraping = threading.Lock()
        r.register(self._state)

    def exposition(self, view: ClusterView | None = None) -> bytes:
        """The metrics in Prometheus' text format. ``view``: the cluster as read on the
        coordinator's loop, so that the formatting (a hundred milliseconds at 2,048 nodes, eight
        samples each) can run in a thread, away from the loop that reads heartbeats."""
        with self._scraping:
            view = view if view is not None else self._state.view()
            for t in view.tasks:  # the per-task counters from zero, for every task known
                self.lost_micro_batches.labels(t.record.name)
                self.lost_steps.labels(t.record.name)
            self._state.given = view
            try:
                return generate_latest(self.registry)
            finally:
                self._state.given = None

    def on_event(self, event_id: int, what: str, task: str | None, detail: dict[str, Any]) -> None:
        """An event was recorded: count and time what it tells (``breakdown.py`` reads the same)."""
        incident = detail.get("incident")
        if what == "incident":
            self.incidents.labels(str(detail.get("kind")), str(detail.get("severity"))).inc()
            if task is not None:
                self.steps_at[event_id] = (task, int(detail.get("step", 0)))
            if detail.get("detection_s") is not None:
                self.detection.observe(float(detail["detection_s"]))
            if detail.get("action") in LABELS:  # (a storage incident's is its own)
                self.tiers.labels(str(detail["action"])).inc()
        elif what == "escalation" and detail.get("carried"):
            self.tiers.labels(str(detail.get("to_action"))).inc()
        elif what == "response" and isinstance(incident, int):
            self.decision.observe(float(detail.get("decision_s", 0.0)))
            self.decided_at[incident] = float(detail.get("decided_at", 0.0))
        elif what == "recomputed" and task is not None:
            self.lost_micro_batches.labels(task).inc(int(detail.get("micro_batches", 0)))
        elif what == "outcome" and isinstance(incident, int):
            self._closed(task, incident, detail)
        elif what in ("mass_silence", "mass_silence_over"):
            self.mass_silence.set(1 if what == "mass_silence" else 0)
        elif what in ("domain_silence", "domain_silence_over"):
            self.domain_silence.labels(str(detail.get("domain"))).set(1 if what == "domain_silence" else 0)
        elif what == "node_loss_held":
            self.losses_held.labels(str(detail.get("why"))).inc(int(detail.get("count", 1)))
        elif what == "plan":
            self.plan_seconds.labels(str(detail.get("source"))).observe(float(detail.get("seconds", 0.0)))

    def _closed(self, task: str | None, incident: int, detail: dict[str, Any]) -> None:
        decided = self.decided_at.pop(incident, None)
        opened = self.steps_at.pop(incident, None)
        if detail.get("outcome") != "recovered":
            return
        self.downtime.observe(float(detail.get("downtime_s", 0.0)))
        computing = detail.get("resumed_at")
        if decided is not None and computing is not None:
            self.transition.observe(max(0.0, float(computing) - decided))
        resumed = detail.get("resumed_step")
        if task is not None and opened is not None and resumed is not None:
            self.lost_steps.labels(task).inc(max(0, opened[1] - (int(resumed) - 1)))


class _State(Collector):
    """The gauges, read from a fresh view at each scrape."""

    def __init__(self, view: Callable[[], ClusterView]) -> None:
        self.view = view
        self.given: ClusterView | None = None  # a view read beforehand (Metrics.exposition)

    def describe(self) -> list[Metric]:
        return []  # not known before a scrape (labels come from the cluster)

    def collect(self) -> Iterator[Metric]:
        v = self.given or self.view()
        yield from _task_gauges(v)
        yield from _cluster_gauges(v)
        yield from _node_gauges(v)


def _gauge(
    name: str, doc: str, labels: list[str], values: list[tuple[list[str], float]]
) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=labels)
    for label_values, value in values:
        family.add_metric(label_values, value)
    return family


def _task_gauges(v: ClusterView) -> Iterator[Metric]:
    """Each task's gauges, for every task the coordinator knows (as ``unicron_task_state``),
    ended ones included until they are removed, at what an ended task has: no workers, replicas
    or throughput, its last step. That is how kube-state-metrics serves a completed pod: the
    series live as long as the object, its state in a gauge of its own to join on
    (``* on (task) group_left unicron_task_state{state="running"}``). So a finished task's
    progress reads 100% and its WAF drops to 0, where a dropped series would leave a line that
    stops at its last value and an idle cluster's panels with "No data"; a ``state`` label on
    each gauge instead would start a new series at every transition and break the lines."""
    yield _gauge(
        "unicron_task_state",
        "1 for the state each task is in (every task the coordinator knows)",
        ["task", "state"],
        [([t.record.name, s.value], float(t.record.state is s)) for t in v.tasks for s in TaskState],
    )

    def live(t: TaskView, value: float | None) -> float | None:
        return value if t.record.state.live else 0.0  # an ended task holds and computes nothing

    per_task: tuple[tuple[str, str, Callable[[TaskView], float | None]], ...] = (
        ("unicron_task_workers", "Workers (GPUs) allocated to the task", lambda t: live(t, t.record.workers)),
        ("unicron_task_replicas", "Data-parallel replicas of the task", lambda t: live(t, t.replicas)),
        ("unicron_task_step", "The last step the task completed", lambda t: t.record.step),
        ("unicron_task_iterations", "The steps the task trains in all", lambda t: t.spec.run.iterations),
        ("unicron_task_weight", "The task's weight in the cluster's WAF", lambda t: t.spec.weight),
        (
            "unicron_task_achieved_waf_flops",
            "Weighted FLOP/s the task achieved recently",
            lambda t: live(t, t.achieved_waf),
        ),
        (
            # Not measured yet: no sample (a 0 would read as a measured stall); none without workers.
            "unicron_task_measured_flops",
            "FLOP/s measured for the task at its current size (0 without workers)",
            lambda t: live(t, t.measured_flops if t.record.workers else 0.0),
        ),
        (
            "unicron_task_planned_waf_flops",
            "Weighted FLOP/s the current plan expects of the task (0: none planned)",
            lambda t: live(t, t.planned_waf or 0.0),
        ),
    )
    for name, doc, get in per_task:
        values = [([t.record.name], float(value)) for t in v.tasks if (value := get(t)) is not None]
        yield _gauge(name, doc, ["task"], values)
    failures = CounterMetricFamily("unicron_task_failures", "Failures the task met", labels=["task"])
    for t in v.tasks:
        failures.add_metric([t.record.name], t.record.failures)
    yield failures


def _cluster_gauges(v: ClusterView) -> Iterator[Metric]:
    yield _gauge(
        "unicron_cluster_waf_flops", "The cluster's weighted achieved FLOP/s, recently", [], [([], v.waf)]
    )
    # No plan in force (no task left, or none decided yet): nothing is planned, 0.
    planned = v.planned_waf or 0.0
    yield _gauge("unicron_cluster_planned_waf_flops", "The current plan's WAF", [], [([], planned)])
    # No task: the optimum is 0; tasks the planner could not divide: unknown (NaN, not a false 0).
    running = any(t.record.state.live for t in v.tasks)
    optimum = v.optimum_waf if v.optimum_waf is not None else math.nan if running else 0.0
    yield _gauge(
        "unicron_cluster_optimum_waf_flops",
        "The WAF the planner reaches with every registered node healthy",
        [],
        [([], optimum)],
    )
    yield _gauge("unicron_incidents_open", "Incidents not yet recovered", [], [([], v.open_incidents)])
    yield _gauge(
        "unicron_coordinator_late_seconds",
        "How late the coordinator itself has been over the last heartbeat deadline (its loop's"
        " ticks, or the heartbeats' waits in its sockets): not counted against a node's silence"
        " (control/detect/silence.py)",
        [],
        [([], v.late_s)],
    )
    yield _gauge(
        "unicron_node_losses_held_by_hand",
        "1 while an admin holds every node loss (unicron node hold-losses), else 0",
        [],
        [([], float(v.holding.by_hand))],
    )
    yield _gauge(
        "unicron_node_losses_held_now",
        "Silent nodes whose loss is held back now (a mass silence, a domain partly silent, the"
        " coordinator behind, the loss rate spent, or an admin's hold)",
        [],
        [([], v.holding.nodes)],
    )
    yield _gauge(
        "unicron_store_write_lag_seconds",
        "How long the oldest change not yet durable in the store has waited (control/store/journal.py):"
        " orders, memberships and replies wait for it; heartbeats are read at once",
        [],
        [([], v.store_behind_s)],
    )
    plans = CounterMetricFamily(
        "unicron_plan_table",
        "Plans looked up in the table, solved, tables rebuilt",
        labels=["outcome"],
    )
    for key, outcome in PLAN_OUTCOMES.items():  # every outcome, from zero
        plans.add_metric([outcome], v.plan_counts.get(key, 0))
    yield plans


def _node_gauges(v: ClusterView) -> Iterator[Metric]:
    yield _gauge(
        "unicron_node_state",
        "1 for the state each node is in",
        ["node", "state"],
        [([n.name, s.value], float(n.state is s)) for n in v.nodes for s in NodeState],
    )
    yield _gauge(
        "unicron_node_slots", "Slots (GPUs) of each node", ["node"], [([n.name], n.slots) for n in v.nodes]
    )
    yield _gauge(
        "unicron_node_slots_used",
        "Slots holding a worker or a hot spare",
        ["node", "use"],
        [
            ([name, use], float(sum(1 for s in slots if s.task is not None and s.spare == (use == "spare"))))
            for name, slots in v.slots.items()
            for use in ("worker", "spare")
        ],
    )
    yield _gauge(
        "unicron_node_heartbeat_age_seconds",
        "Seconds since each node's last heartbeat",
        ["node"],
        [([n.name], max(0.0, v.time - n.last_seen)) for n in v.nodes],
    )

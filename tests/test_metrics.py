"""The coordinator's Prometheus metrics (control/observe/metrics.py), fed hand-built events and a
hand-built view: what each event counts and times, and the gauges a scrape reads."""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from unicron.brain.records import NodeRecord, TaskRecord
from unicron.control.agent.agentmetrics import AgentMetrics
from unicron.control.coordinator import Coordinator, CoordinatorSettings
from unicron.control.observe.clusterview import ClusterView, Slot, TaskView
from unicron.control.observe.metrics import Metrics
from unicron.core.livespecs import parse_live_tasks
from unicron.core.protocol import Registration
from unicron.core.states import NodeState, TaskState
from unicron.core.taxonomy import TAXONOMY

from .fakecluster import Clock

ROOT = Path(__file__).resolve().parents[1]

SPEC = "name: lm\nweight: 2\nthroughput: {2: 1.0e9}\nrun: {program: [python, x.py], iterations: 100}\n"


def view() -> ClusterView:
    (spec,) = parse_live_tasks(SPEC, "test")
    record = TaskRecord(
        "lm",
        "{}",
        TaskState.RUNNING,
        3,
        2,
        57,
        50,
        0,
        1,
        0,
        None,
        0.5,
        0,
        4e9,
        None,
        0.0,
        1.0,
        None,
        None,
        1,
        0,
    )
    node = NodeRecord(0, "node-0", 2, [], "127.0.0.1", NodeState.HEALTHY, 98.0)
    return ClusterView(
        time=100.0,
        nodes=(node,),
        slots={"node-0": (Slot("lm"), Slot("lm", spare=True))},
        tasks=(TaskView(record, spec, 1.0e9, 2.0e9, 1.8e9),),
        waf=1.8e9,
        planned_waf=2.0e9,
        optimum_waf=2.0e9,
        open_incidents=0,
        plan_counts={"table": 3, "solved": 1, "rebuilds": 4},
        late_s=0.8,
        store_behind_s=1.5,
    )


def scraped(metrics: Metrics) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = metrics.exposition().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_an_incident_is_counted_and_each_phase_timed_once_it_is_recovered() -> None:
    m = Metrics(view)
    events: list[tuple[int, str, dict[str, Any]]] = [
        (
            7,
            "incident",
            {
                "kind": "node_lost",
                "severity": "SEV1",
                "step": 41,
                "detection_s": 2.5,
                "action": "reconfigure",
            },
        ),
        (8, "response", {"incident": 7, "decided_at": 100.0, "decision_s": 0.004}),
        (80, "escalation", {"incident": 7, "to_action": "restart failed processes", "carried": False}),
        (81, "escalation", {"incident": 7, "to_action": "restart from checkpoint", "carried": True}),
        (9, "recomputed", {"incident": 7, "micro_batches": 3}),
        (
            10,
            "outcome",
            {
                "incident": 7,
                "outcome": "recovered",
                "downtime_s": 30.0,
                "resumed_step": 31,
                "resumed_at": 125.0,
            },
        ),
        (11, "plan", {"source": "table", "seconds": 0.0002}),
    ]
    for event_id, what, detail in events:
        m.on_event(event_id, what, "lm", detail)
    found = scraped(m)
    assert found[("unicron_incidents_total", frozenset({("kind", "node_lost"), ("severity", "SEV1")}))] == 1
    tiers = {
        dict(labels)["tier"]: v
        for (name, labels), v in found.items()
        if name == "unicron_recovery_tiers_total"
    }
    assert tiers == {"reattempt in place": 0, "restart failed processes": 0, "reconfigure": 1,
                     "restart from checkpoint": 1, "fail task": 0}  # fmt: skip
    assert found[("unicron_detection_seconds_sum", frozenset())] == 2.5
    assert found[("unicron_decision_seconds_sum", frozenset())] == 0.004
    assert found[("unicron_transition_seconds_sum", frozenset())] == 25.0  # response to computing resumed
    assert found[("unicron_downtime_seconds_sum", frozenset())] == 30.0
    assert found[("unicron_lost_steps_total", frozenset({("task", "lm")}))] == 11  # steps 31..41 again
    assert found[("unicron_lost_micro_batches_total", frozenset({("task", "lm")}))] == 3
    assert found[("unicron_plan_decision_seconds_count", frozenset({("source", "table")}))] == 1


def test_a_superseded_incident_times_nothing_but_its_detection() -> None:
    m = Metrics(view)
    m.on_event(1, "incident", "lm", {"kind": "exited_abnormally", "severity": "SEV2", "step": 3})
    m.on_event(2, "response", "lm", {"incident": 1, "decided_at": 10.0, "decision_s": 0.001})
    m.on_event(3, "outcome", "lm", {"incident": 1, "outcome": "superseded", "by": 4})
    found = scraped(m)
    assert found[("unicron_transition_seconds_count", frozenset())] == 0
    assert found[("unicron_downtime_seconds_count", frozenset())] == 0
    assert (m.decided_at, m.steps_at) == ({}, {})  # nothing kept for a closed incident


def test_the_gauges_read_the_view_at_each_scrape() -> None:
    found = scraped(Metrics(view))
    task = frozenset({("task", "lm")})
    assert found[("unicron_task_state", frozenset({("task", "lm"), ("state", "running")}))] == 1
    assert found[("unicron_task_state", frozenset({("task", "lm"), ("state", "finished")}))] == 0
    assert (found[("unicron_task_workers", task)], found[("unicron_task_step", task)]) == (2, 57)
    assert found[("unicron_task_planned_waf_flops", task)] == 2.0e9
    assert found[("unicron_cluster_optimum_waf_flops", frozenset())] == 2.0e9
    node = frozenset({("node", "node-0")})
    assert found[("unicron_node_heartbeat_age_seconds", node)] == 2.0
    assert found[("unicron_node_slots_used", node | {("use", "spare")})] == 1
    assert found[("unicron_plan_table_total", frozenset({("outcome", "lookup")}))] == 3
    assert found[("unicron_coordinator_late_seconds", frozenset())] == 0.8
    assert found[("unicron_store_write_lag_seconds", frozenset())] == 1.5


def test_the_documented_metrics_are_the_ones_defined() -> None:
    """Every metric docs/observability.md names is defined (counters are served with ``_total``)."""
    documented = set(re.findall(r"`(unicron_[a-z_]+)`", (ROOT / "docs" / "observability.md").read_text()))
    source = "".join(
        (ROOT / "src" / "unicron" / "control" / f).read_text()
        for f in ("observe/metrics.py", "agent/agentmetrics.py")
    )
    assert documented and all(f'"{name.removesuffix("_total")}"' in source for name in documented), sorted(
        n for n in documented if f'"{n.removesuffix("_total")}"' not in source
    )


# ---------------------------------------------------------------- an idle cluster, as Grafana sees it


def plotted() -> set[str]:
    """Every metric name a panel of the Grafana dashboard queries, read out of its expressions."""
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "expr" and isinstance(value, str):
                    found.update(re.findall(r"\bunicron_\w+", value))
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(json.loads((ROOT / "deploy" / "grafana" / "unicron.json").read_text()))
    return found


def served(text: str) -> tuple[set[str], dict[str, list[dict[str, str]]]]:
    """The names an exposition declares (``# TYPE``, a histogram's series too) and each sampled
    name's label sets."""
    declared: set[str] = set()
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M):
        declared |= {name} | (
            {f"{name}_bucket", f"{name}_count", f"{name}_sum"} if kind == "histogram" else set()
        )
    sampled: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            sampled.setdefault(s.name, []).append(dict(s.labels))
    return declared, sampled


def idle(*tasks: TaskView) -> ClusterView:
    """Two healthy nodes, nothing running: what the coordinator's viewer reads then (no plan in
    force, no optimum without a task)."""
    nodes = tuple(NodeRecord(i, f"node-{i}", 2, [], "127.0.0.1", NodeState.HEALTHY, 99.0) for i in range(2))
    return ClusterView(
        time=100.0,
        nodes=nodes,
        slots={n.name: (Slot(None), Slot(None)) for n in nodes},
        tasks=tasks,
        waf=0.0,
        planned_waf=None,
        optimum_waf=None,
        open_incidents=0,
        plan_counts={"table": 0, "solved": 0, "rebuilds": 0},
    )


def ended(name: str, state: TaskState, step: int) -> TaskView:
    """The test's task once it ended (its record keeps the workers it last had)."""
    (running,) = view().tasks
    return replace(running, record=replace(running.record, name=name, state=state, step=step))


def test_every_metric_the_dashboard_plots_is_served_once_every_task_ended() -> None:
    plots = {n for n in plotted() if not n.startswith("unicron_agent_")}  # the agents serve theirs
    assert len(plots) > 20, plots
    m = Metrics(lambda: idle(ended("lm", TaskState.FINISHED, 100), ended("lm2", TaskState.FAILED, 40)))
    _, sampled = served(m.exposition().decode())
    assert plots <= sampled.keys(), sorted(plots - sampled.keys())
    found = scraped(m)
    lm = frozenset({("task", "lm")})
    # An ended task holds and computes nothing; its progress stays where it ended.
    assert [found[(f"unicron_task_{g}", lm)] for g in ("workers", "replicas", "achieved_waf_flops")] == [
        0,
        0,
        0,
    ]
    assert [found[(f"unicron_task_{g}", lm)] for g in ("measured_flops", "planned_waf_flops")] == [0, 0]
    assert found[("unicron_task_step", lm)] / found[("unicron_task_iterations", lm)] == 1.0
    assert found[("unicron_task_state", lm | {("state", "finished")})] == 1
    # The cluster's figures at 0, the counters from zero.
    for name in (
        "unicron_cluster_waf_flops",
        "unicron_cluster_planned_waf_flops",
        "unicron_cluster_optimum_waf_flops",
    ):
        assert found[(name, frozenset())] == 0, name
    assert found[("unicron_lost_steps_total", lm)] == found[("unicron_lost_micro_batches_total", lm)] == 0
    assert found[("unicron_lost_steps_total", frozenset({("task", "lm2")}))] == 0


def test_an_idle_coordinator_that_never_ran_a_task_serves_every_name_it_can() -> None:
    """A fresh coordinator: every plotted name is declared, and every one with a sample, except
    those per task (no task, no label value): counters from zero for every kind, tier, plan
    source and outcome, the cluster's figures at 0."""
    plots = {n for n in plotted() if not n.startswith("unicron_agent_")}
    declared, sampled = served(Metrics(idle).exposition().decode())
    assert plots <= declared, sorted(plots - declared)
    _, once = served(Metrics(lambda: idle(ended("lm", TaskState.FINISHED, 100))).exposition().decode())
    per_task = {n for n, labels in once.items() if all("task" in ls for ls in labels)}
    assert plots - sampled.keys() <= per_task, sorted(plots - sampled.keys() - per_task)
    assert {"unicron_lost_steps_total", "unicron_task_workers"} <= per_task  # (the check checks)
    incidents = {(ls["kind"], ls["severity"]) for ls in sampled["unicron_incidents_total"]}
    assert incidents == {(k.value, info.severity.name) for k, info in TAXONOMY.items()}
    found = scraped(Metrics(idle))
    assert found[("unicron_plan_decision_seconds_count", frozenset({("source", "solved")}))] == 0
    assert found[("unicron_plan_table_total", frozenset({("outcome", "rebuild")}))] == 0
    assert found[("unicron_cluster_optimum_waf_flops", frozenset())] == 0


def test_an_idle_agent_serves_what_the_dashboard_plots_of_it() -> None:
    plots = {n for n in plotted() if n.startswith("unicron_agent_")}
    declared, sampled = served(generate_latest(AgentMetrics().registry).decode())
    assert plots and plots <= declared, sorted(plots - declared)
    assert plots - sampled.keys() <= {"unicron_agent_worker_launches_total"}  # per task: none yet


def test_an_optimum_the_planner_could_not_find_is_unknown_not_zero() -> None:
    (task,) = view().tasks
    found = scraped(Metrics(lambda: idle(task)))
    assert math.isnan(found[("unicron_cluster_optimum_waf_flops", frozenset())])
    assert found[("unicron_cluster_planned_waf_flops", frozenset())] == 0  # no plan in force yet


def test_a_coordinator_idle_and_once_its_task_ended_serves_what_the_dashboard_plots(
    make: Any, tmp_path: Path
) -> None:
    """The same, read from a coordinator's own view (tests/fakecluster.py): a fresh one with two
    nodes and no task, and one whose task was cancelled."""
    plots = {n for n in plotted() if not n.startswith("unicron_agent_")}
    settings = CoordinatorSettings(state_dir=tmp_path / "fresh", checkpoint_root=tmp_path / "ckpt")
    fresh = Coordinator(settings, Clock())
    try:
        for node in ("n0", "n1"):
            fresh.register(Registration(node=node, slots=2))
        declared, sampled = served(fresh.metrics.exposition().decode())
    finally:
        fresh.shutdown()
    assert plots <= declared, sorted(plots - declared)
    unsampled = plots - sampled.keys()
    assert unsampled and all(n.startswith(("unicron_task_", "unicron_lost_")) for n in unsampled), unsampled
    cluster = make()
    assert cluster.c.cancel("lm")
    cluster.step()
    _, sampled = served(cluster.c.metrics.exposition().decode())
    assert plots <= sampled.keys(), sorted(plots - sampled.keys())
    found = scraped(cluster.c.metrics)
    assert found[("unicron_task_workers", frozenset({("task", "lm")}))] == 0
    assert found[("unicron_cluster_planned_waf_flops", frozenset())] == 0


def test_the_dashboards_optimum_is_never_below_the_plan_in_force(make: Any) -> None:
    """The optimum is planned from scratch for every registered node healthy (as the simulator's
    oracle): planned from where the workers were, moving them cost, and it fell below the plan."""
    cluster = make()
    cluster.exit(3)  # recovered in place on three; the plan grows it back
    for step in range(2, 6):
        cluster.train(step)
        cluster.step()
    view = cluster.c.viewer.view()
    assert view.planned_waf is not None and view.optimum_waf is not None
    assert view.optimum_waf >= view.planned_waf

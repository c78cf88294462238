"""The coordinator's Prometheus metrics (control/observe/metrics.py), fed hand-built events and a
hand-built view: what each event counts and times, and the gauges a scrape reads."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from unicron.control.observe.clusterview import ClusterView, Slot, TaskView
from unicron.control.observe.metrics import Metrics
from unicron.control.store.records import NodeRecord, TaskRecord
from unicron.core.livespecs import parse_live_tasks
from unicron.core.states import NodeState, TaskState

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


def test_the_documented_metrics_are_the_ones_defined() -> None:
    """Every metric docs/observability.md names is defined (counters are served with ``_total``)."""
    root = Path(__file__).resolve().parents[1]
    documented = set(re.findall(r"`(unicron_[a-z_]+)`", (root / "docs" / "observability.md").read_text()))
    source = "".join(
        (root / "src" / "unicron" / "control" / f).read_text()
        for f in ("observe/metrics.py", "agent/agentmetrics.py")
    )
    assert documented and all(f'"{name.removesuffix("_total")}"' in source for name in documented), sorted(
        n for n in documented if f'"{n.removesuffix("_total")}"' not in source
    )

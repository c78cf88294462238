"""Each incident's breakdown (control/observe/breakdown.py), read from hand-built event logs."""

from __future__ import annotations

from typing import Any

import pytest

from unicron.brain.records import EventRecord
from unicron.control.observe.breakdown import breakdowns, line


def event(id: int, what: str, time: float, **d: Any) -> EventRecord:
    """An event: ``task`` (default "lm") and ``node`` taken out of the detail."""
    return EventRecord(id, time, what, d.pop("task", "lm"), d.pop("node", None), d)


def incident(id: int, time: float, **d: Any) -> EventRecord:
    base = {"kind": "worker_killed", "severity": "SEV2", "action": "restart failed processes", "step": 41}
    return event(id, "incident", time, node="node-1", **{**base, "detected_at": time, **d})


def test_an_in_place_recovery_is_timed_phase_by_phase_with_its_recomputed_work() -> None:
    log = [
        event(1, "fault_injected", 99.0),
        incident(2, 100.0, fault_at=99.2, fault_source="injected"),
        event(3, "response", 100.01, incident=2, decided_at=100.004, action="restart failed processes"),
        event(4, "in_process_recovery", 100.01, incident=2),
        event(5, "recomputed", 100.9, incident=2, rank=0, step=42, micro_batches=2),
        event(6, "recomputed", 100.95, incident=2, rank=1, step=42, micro_batches=2),
        event(
            7,
            "outcome",
            101.0,
            incident=2,
            outcome="recovered",
            resumed_step=42,
            first_step_ended_at=100.9,
            resumed_at=100.5,
            downtime_s=0.9,
            actions=["restart failed processes"],
        ),
    ]
    (b,) = breakdowns(log)
    assert (b.incident, b.node, b.fault_source, b.outcome) == (2, "node-1", "injected", "recovered")
    assert b.seconds() == {"detection": 0.8, "decision": 0.004, "transition": 0.496, "first_step": 0.4}
    assert (b.lost_steps, b.lost_micro_batches) == (0, 4)  # resumed at the next step: nothing redone
    assert b.actions == ("restart failed processes",)
    assert "lost 0 step(s), 4 micro-batch(es)" in line(b) and "(fault injected)" in line(b)


def test_a_restart_from_a_checkpoint_loses_the_steps_since_it_and_keeps_its_escalations() -> None:
    log = [
        incident(
            10, 200.0, detection_s=2.5, action="restart failed processes", kind="node_lost", severity="SEV1"
        ),
        event(11, "response", 200.01, incident=10, decided_at=200.002),
        event(12, "escalation", 220.0, incident=10, to_action="restart from checkpoint"),
        event(13, "recomputed", 221.0, incident=99, micro_batches=7),  # another incident's work
        event(
            14,
            "outcome",
            230.0,
            incident=10,
            outcome="recovered",
            resumed_step=31,
            first_step_ended_at=229.5,
            resumed_at=228.0,
        ),
    ]
    (b,) = breakdowns(log)
    assert b.fault_at == 197.5  # an incident recorded with only its detection time
    assert b.fault_source is None
    assert b.actions == ("restart failed processes", "restart from checkpoint")
    assert (b.lost_steps, b.lost_micro_batches) == (11, 0)  # steps 31..41 trained again
    assert b.seconds()["transition"] == pytest.approx(228.0 - 200.002)


def test_a_root_cause_found_later_names_the_fault() -> None:
    log = [
        incident(1, 10.0, kind="connection_reset", severity="SEV3"),
        event(
            2,
            "root_cause",
            12.0,
            node="node-3",
            incident=1,
            kind="node_lost",
            first_seen_as="connection_reset",
        ),
    ]
    (b,) = breakdowns(log)
    assert (b.kind, b.node, b.first_seen_as) == ("node_lost", "node-3", "connection_reset")


def test_open_superseded_and_failed_incidents_say_so() -> None:
    log = [
        incident(1, 10.0),
        incident(2, 11.0),
        event(3, "outcome", 11.0, incident=1, outcome="superseded", by=2),
        incident(4, 12.0, task="other"),
        event(5, "outcome", 12.5, incident=4, outcome="task failed", actions=["task failed"]),
    ]
    found = {b.incident: b for b in breakdowns(log)}
    assert [found[i].outcome for i in (1, 2, 4)] == ["superseded", None, "task failed"]
    assert found[2].seconds() == {"detection": None, "decision": None, "transition": None, "first_step": None}
    assert found[4].regained_at is None and found[4].actions == ("task failed",)
    assert "not yet timed" in line(found[2])

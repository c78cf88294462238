"""Public fault datasets converted to traces (``sim/public_traces.py``, ``unicron trace convert``):
InfiniteHBD's events as failures, bad input named, and the result replayed by ``unicron simulate``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from unicron.core.errors import SpecError
from unicron.core.taxonomy import TAXONOMY, ErrorKind
from unicron.sim.public_traces import KINDS, from_infinitehbd
from unicron.sim.traces import Failure, parse_trace

from .test_cli_plan import cli

GPU_ECC = {"Level": "Hardware Failure", "Class": "GPU", "Desc": "GPU DBE(Double Bit ECC) > Threshold"}
GPU_XID = {"Level": "Hardware Failure", "Class": "GPU", "Desc": "GPU xid Error"}
LINK = {"Level": "Hardware Failure", "Class": "Parameter Plane Cable", "Desc": "Link Down"}


def event(node: str, days: float, kind: str, fault: dict[str, str]) -> dict[str, object]:
    return {"node_id": node, "event_time": days, "event_type": f"fault_{kind}", "fault_type": fault}


EVENTS = [
    event("b", 1.0, "start", GPU_ECC),
    event("a", 1.5, "start", LINK),
    event("b", 2.0, "end", GPU_ECC),
    event("a", 2.5, "start", GPU_XID),  # a second fault of a node already out
    event("a", 3.0, "end", LINK),
    event("c", 3.5, "end", LINK),  # an end with no start
    event("a", 4.0, "end", GPU_XID),
    event("b", 5.0, "start", GPU_XID),  # still open at the end
    event("a", 6.0, "start", LINK),
    event("a", 6.5, "end", LINK),
]


def test_each_fault_is_a_failure_of_its_node_out_for_its_length() -> None:
    converted = from_infinitehbd(json.dumps(EVENTS), "fault_trace.json")
    assert converted.failures == [
        Failure(24.0, 0, ErrorKind.ECC_ERROR, 24.0),
        Failure(36.0, 1, ErrorKind.NODE_LOST, 36.0),
        Failure(60.0, 1, ErrorKind.GPU_DRIVER_ERROR, 36.0),
        Failure(120.0, 0, ErrorKind.GPU_DRIVER_ERROR, 36.0),  # until the last event
        Failure(144.0, 1, ErrorKind.NODE_LOST, 12.0),
    ]
    assert (converted.nodes, converted.days, converted.open_at_end, converted.ends_without_start) == (
        3,
        6.5,
        1,
        1,
    )
    # Every fault takes its node out: each kind is one the simulator repairs.
    assert all(TAXONOMY[k].needs_repair for k in [*KINDS.values(), ErrorKind.NODE_LOST])


@pytest.mark.parametrize(
    ("events", "where"),
    [
        ("{}", "expected a list of events"),
        ("[1]", "events[0]: not an object"),
        (json.dumps([{**EVENTS[0], "event_time": "soon"}]), "events[0].event_time"),
        (json.dumps([{**EVENTS[0], "event_time": -1}]), "events[0].event_time"),
        (json.dumps([EVENTS[0], {**EVENTS[1], "event_type": "fault_maybe"}]), "events[1].event_type"),
        (json.dumps([{"event_time": 1, "event_type": "fault_start"}]), "events[0].node_id"),
    ],
)
def test_bad_events_are_named(events: str, where: str) -> None:
    with pytest.raises(SpecError) as caught:
        from_infinitehbd(events, "fault_trace.json")
    assert where in str(caught.value)


def test_the_command_writes_a_trace_that_simulate_replays(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, trace = tmp_path / "fault_trace.json", tmp_path / "trace.csv"
    source.write_text(json.dumps(EVENTS))
    code, _, err = cli(capsys, "trace", "convert", str(source), "--out", str(trace))
    assert code == 0, err
    assert "5 faults of 3 nodes over 6.5 days (1 still open at its end" in " ".join(err.split())
    assert parse_trace(trace.read_text(), str(trace)) == from_infinitehbd(json.dumps(EVENTS), "x").failures
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        "name: s\ndays: 1\ncluster: {nodes: 3, gpus_per_node: 8, gpu: A100, node_mtbf_hours: 100}\n"
        "tasks: [{name: t, weight: 1, throughput: {8: 1.0e15, 16: 1.8e15, 24: 2.5e15}}]\n"
        "policies: [unicron, megatron]\n"
    )
    code, out, err = cli(capsys, "simulate", str(scenario), "--trace", str(trace), "--span-trace", "--json")
    assert code == 0, err
    assert json.loads(out)["failures"] == 5
    code, _, err = cli(capsys, "trace", "convert", str(source), "--format", "lanl")
    assert code == 2 and "unknown format 'lanl'" in err

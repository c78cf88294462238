"""Public fault datasets as the simulator's traces (``time_hours,node,kind,repair_hours``).

One format so far, StepFun's InfiniteHBD trace (``fault_trace.json`` of
github.com/stepfun-ai/InfiniteHBD-Trace, SIGCOMM 2025: 348 days of faults of 400 GPU servers of
an LLM pre-training cluster): a list of events ``{node_id, event_time (days), event_type
(fault_start | fault_end), fault_type {Level, Class, Desc}}``, each fault its node unavailable
from its start to its end. Each fault becomes one failure of its node, at its start (the times
kept as they are), out for its length; a node's number is its order of first appearance. Every
fault takes its node out, so each maps to a kind the simulator repairs (``KINDS``): ECC errors
and silent data corruption as themselves, the GPU's other faults as a driver error, the rest
(network, power, fans, "unknown", stress tests) as a lost node. A fault still open at the
trace's end lasts until the last event; an end with no start is left out, and counted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from unicron.core.errors import SpecError, SpecProblem
from unicron.core.taxonomy import ErrorKind
from unicron.sim.traces import MAX_HOURS, Failure

FORMATS = ("infinitehbd",)
MAX_EVENTS = 2_000_000  # an input larger than this is refused before it is read event by event
# (Class, Desc) -> kind; a Class alone (Desc "*") for the rest of its descriptions; else NODE_LOST.
KINDS: dict[tuple[str, str], ErrorKind] = {
    ("GPU", "GPU DBE(Double Bit ECC) > Threshold"): ErrorKind.ECC_ERROR,
    ("GPU", "GPU SBE(Single Bit ECC) > Threshold"): ErrorKind.ECC_ERROR,
    ("GPU", "Silent Data Corruption"): ErrorKind.SILENT_DATA_CORRUPTION,
    ("GPU", "*"): ErrorKind.GPU_DRIVER_ERROR,
}


@dataclass(frozen=True)
class Converted:
    """A dataset's faults as failures, with what the conversion saw."""

    failures: list[Failure]
    nodes: int  # distinct nodes (numbered 0..nodes-1)
    days: float  # until the last event (the dataset's times count from its own origin)
    open_at_end: int  # faults with no end: out until the last event
    ends_without_start: int  # left out


def kind_of(fault_type: dict[str, Any]) -> ErrorKind:
    """The simulator's kind for an InfiniteHBD ``fault_type``."""
    cls, desc = str(fault_type.get("Class", "")), str(fault_type.get("Desc", ""))
    return KINDS.get((cls, desc)) or KINDS.get((cls, "*")) or ErrorKind.NODE_LOST


def _events(text: str, source: str) -> list[dict[str, Any]]:
    """The events, each checked for the fields the conversion reads (every problem named)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecError(
            source, [SpecProblem(f"line {exc.lineno}", f"not valid JSON: {exc.msg}", "pass fault_trace.json")]
        ) from None
    if not isinstance(data, list):
        raise SpecError(source, [SpecProblem("", "expected a list of events", "pass fault_trace.json")])
    if len(data) > MAX_EVENTS:
        raise SpecError(source, [SpecProblem("", f"{len(data)} events, over {MAX_EVENTS}", "split the file")])
    problems = []
    for i, event in enumerate(data):
        where = f"events[{i}]"
        if not isinstance(event, dict):
            problems.append(SpecProblem(where, "not an object", "use node_id, event_time, event_type"))
        elif not isinstance(event.get("node_id"), str):
            problems.append(SpecProblem(f"{where}.node_id", "missing or not a string", "give the node's id"))
        elif not isinstance(t := event.get("event_time"), int | float) or isinstance(t, bool):
            problems.append(SpecProblem(f"{where}.event_time", "missing or not a number", "give days"))
        elif not 0 <= t * 24 <= MAX_HOURS:
            problems.append(SpecProblem(f"{where}.event_time", f"{t} days", f"use 0 to {MAX_HOURS / 24:g}"))
        elif event.get("event_type") not in ("fault_start", "fault_end"):
            problems.append(SpecProblem(f"{where}.event_type", "not fault_start or fault_end", "use one"))
        elif not isinstance(event.get("fault_type", {}), dict):
            problems.append(SpecProblem(f"{where}.fault_type", "not an object", "give Level, Class, Desc"))
    if problems:
        raise SpecError(source, problems)
    return sorted(data, key=lambda e: float(e["event_time"]))


def from_infinitehbd(text: str, source: str) -> Converted:
    """InfiniteHBD's ``fault_trace.json`` as failures (the module's docstring says how)."""
    events = _events(text, source)
    numbers: dict[str, int] = {}
    started: dict[tuple[str, str], list[tuple[float, ErrorKind]]] = {}  # (node, fault) -> starts
    failures, orphans = [], 0
    last = float(events[-1]["event_time"]) * 24 if events else 0.0
    for event in events:
        node, hours = event["node_id"], float(event["event_time"]) * 24
        number = numbers.setdefault(node, len(numbers))
        fault = event.get("fault_type", {})
        key = (node, json.dumps(fault, sort_keys=True))
        if event["event_type"] == "fault_start":
            started.setdefault(key, []).append((hours, kind_of(fault)))
        elif started.get(key):
            start, kind = started[key].pop(0)
            failures.append(Failure(start, number, kind, hours - start))
        else:
            orphans += 1
    still = [(node, start, kind) for (node, _), opened in started.items() for start, kind in opened]
    failures += [Failure(start, numbers[node], kind, last - start) for node, start, kind in still]
    return Converted(sorted(failures), len(numbers), last / 24, len(still), orphans)


def convert(text: str, source: str, fmt: str) -> Converted:
    if fmt not in FORMATS:
        raise SpecError(
            source, [SpecProblem("--format", f"unknown format {fmt!r}", f"use {', '.join(FORMATS)}")]
        )
    return from_infinitehbd(text, source)

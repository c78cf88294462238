"""Failure traces: the documented format, parsing with line numbers, and a seeded generator.

Format (docs/simulation.md): one row per failure with

- ``time_hours``: when it happens, hours from the start (>= 0);
- ``node``: the node id (0 .. nodes-1);
- ``kind``: a kind of the error taxonomy (``node_lost``, ``ecc_error``, ... see ErrorKind);
- ``repair_hours``: when the node is usable again, hours after the failure (0: no repair).

CSV has a header row with those names (``#`` starts a comment line). JSON is a list of objects
with those keys, or an object with the list under ``failures``.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from unicron.core.errors import SpecError, SpecProblem
from unicron.core.taxonomy import TAXONOMY, ErrorKind

FIELDS = ("time_hours", "node", "kind", "repair_hours")
KIND_NAMES = ", ".join(k.value for k in ErrorKind)


@dataclass(frozen=True, order=True)
class Failure:
    time_hours: float
    node: int
    kind: ErrorKind
    repair_hours: float


def _row(values: Mapping[str, Any], nodes: int | None) -> Failure:
    missing = [f for f in FIELDS if values.get(f) in (None, "")]
    if missing:
        raise ValueError(f"missing {', '.join(missing)}; give all of {', '.join(FIELDS)}")
    try:
        time = float(values["time_hours"])
        repair = float(values["repair_hours"])
    except (TypeError, ValueError):
        raise ValueError("time_hours and repair_hours must be numbers") from None
    if not (math.isfinite(time) and time >= 0):
        raise ValueError(f"time_hours {values['time_hours']!r} must be a number >= 0")
    if not (math.isfinite(repair) and repair >= 0):
        raise ValueError(f"repair_hours {values['repair_hours']!r} must be a number >= 0")
    raw_node = str(values["node"]).strip()
    if not raw_node.isdigit():
        raise ValueError(f"node {values['node']!r} must be a whole number >= 0")
    node = int(raw_node)
    if nodes is not None and node >= nodes:
        raise ValueError(f"node {node} does not exist: the cluster has nodes 0..{nodes - 1}")
    try:
        kind = ErrorKind(str(values["kind"]).strip().lower())
    except ValueError:
        raise ValueError(f"unknown kind {values['kind']!r}; use one of {KIND_NAMES}") from None
    return Failure(time, node, kind, repair)


def parse_csv(text: str, source: str, nodes: int | None = None) -> list[Failure]:
    lines = [
        (n, line)
        for n, line in enumerate(text.splitlines(), 1)
        if line.strip() and not line.lstrip().startswith("#")
    ]
    if not lines:
        raise SpecError(source, [SpecProblem("", "the trace is empty", f"add a header: {','.join(FIELDS)}")])
    header_no, header = lines[0]
    names = [h.strip() for h in next(csv.reader(io.StringIO(header)))]
    if sorted(names) != sorted(FIELDS):
        raise SpecError(
            source,
            [
                SpecProblem(
                    f"line {header_no}", f"header is {','.join(names)}", f"use the header {','.join(FIELDS)}"
                )
            ],
        )
    failures, problems = [], []
    for number, line in lines[1:]:
        cells = next(csv.reader(io.StringIO(line)))
        if len(cells) != len(names):
            problems.append(
                SpecProblem(
                    f"line {number}",
                    f"{len(cells)} fields, expected {len(names)}",
                    "give one value per header column",
                )
            )
            continue
        try:
            failures.append(_row(dict(zip(names, cells, strict=True)), nodes))
        except ValueError as exc:
            problems.append(SpecProblem(f"line {number}", str(exc), "correct or remove the row"))
    if problems:
        raise SpecError(source, problems)
    return sorted(failures)


def parse_json(text: str, source: str, nodes: int | None = None) -> list[Failure]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SpecError(
            source,
            [SpecProblem(f"line {exc.lineno}", f"not valid JSON: {exc.msg}", "correct the JSON syntax")],
        ) from None
    rows = data.get("failures") if isinstance(data, dict) else data
    if not isinstance(rows, list):
        raise SpecError(
            source,
            [SpecProblem("", "expected a list of failures", 'write [ {...}, ... ] or {"failures": [...]}')],
        )
    failures, problems = [], []
    for index, row in enumerate(rows):
        if not isinstance(row, dict):
            problems.append(
                SpecProblem(f"failures[{index}]", "not an object", f"use keys {', '.join(FIELDS)}")
            )
            continue
        extra = set(row) - set(FIELDS)
        if extra:
            problems.append(
                SpecProblem(
                    f"failures[{index}]", f"unknown keys {sorted(extra)}", f"use only {', '.join(FIELDS)}"
                )
            )
            continue
        try:
            failures.append(_row(row, nodes))
        except ValueError as exc:
            problems.append(SpecProblem(f"failures[{index}]", str(exc), "correct or remove the entry"))
    if problems:
        raise SpecError(source, problems)
    return sorted(failures)


def parse_trace(text: str, source: str, nodes: int | None = None) -> list[Failure]:
    """Parse CSV or JSON (by the file name's ending, else by its first character)."""
    if source.endswith(".json") or (not source.endswith(".csv") and text.lstrip()[:1] in "[{"):
        return parse_json(text, source, nodes)
    return parse_csv(text, source, nodes)


def to_csv(failures: list[Failure]) -> str:
    out = io.StringIO()
    out.write(",".join(FIELDS) + "\n")
    for f in failures:
        out.write(f"{f.time_hours:.6f},{f.node},{f.kind.value},{f.repair_hours:.6f}\n")
    return out.getvalue()


def generate(
    *,
    nodes: int,
    hours: float,
    node_mtbf_hours: float,
    mix: Mapping[ErrorKind, float],
    seed: int,
    distribution: Literal["exponential", "weibull"] = "exponential",
    weibull_shape: float = 0.7,
    repair_median_hours: float = 4.0,
    repair_sigma: float = 1.0,
    count: int | None = None,
) -> list[Failure]:
    """A seeded synthetic trace.

    Each node fails as a renewal process with mean time between failures ``node_mtbf_hours``:
    exponential gaps, or Weibull gaps with shape below 1 for bursty faults (same mean). With
    ``count``, exactly that many failures at uniform times on uniform nodes instead. Kinds are
    drawn from ``mix``; kinds that need a repair get a log-normal (heavy-tailed) repair time with
    the given median, the others 0.
    """
    rng = np.random.default_rng(seed)
    times: list[float] = []
    where: list[int] = []
    if count is not None:
        times = sorted(rng.uniform(0, hours, count).tolist())
        where = rng.integers(0, nodes, count).tolist()
    else:
        if distribution == "weibull":
            scale = node_mtbf_hours / math.gamma(1 + 1 / weibull_shape)
        # Weibull gaps with shape < 1 make a fresh process fail early; start each node's process
        # well before time 0 so that the trace sees it in its steady state (rate 1 / MTBF).
        burn_in = 20 * node_mtbf_hours if distribution == "weibull" else 0.0
        for node in range(nodes):
            clock = -burn_in
            while True:
                if distribution == "weibull":
                    gap = scale * float(rng.weibull(weibull_shape))
                else:
                    gap = float(rng.exponential(node_mtbf_hours))
                clock += gap
                if clock >= hours:
                    break
                if clock < 0:
                    continue
                times.append(clock)
                where.append(node)
    kinds = list(mix)
    weights = np.array([mix[k] for k in kinds], dtype=float)
    drawn = rng.choice(len(kinds), size=len(times), p=weights / weights.sum())
    repairs = rng.lognormal(math.log(repair_median_hours), repair_sigma, size=len(times))
    return sorted(
        Failure(t, n, kinds[k], float(r) if TAXONOMY[kinds[k]].needs_repair else 0.0)
        for t, n, k, r in zip(times, where, drawn, repairs, strict=True)
    )

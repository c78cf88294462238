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
MAX_DAYS = 3660  # a scenario's length at most: ten years, far beyond any published fault trace (348 days)
# A day less: a trace spanned by whole days (``spanned_days``) still fits a scenario.
MAX_HOURS = (MAX_DAYS - 1) * 24
KIND_NAMES = ", ".join(k.value for k in ErrorKind)


@dataclass(frozen=True, order=True)
class Failure:
    time_hours: float
    node: int
    kind: ErrorKind
    repair_hours: float


class RowProblem(ValueError):
    """A row the trace cannot hold, with the fix to say beside it."""

    def __init__(self, what: str, fix: str) -> None:
        super().__init__(what)
        self.fix = fix


def _fix(exc: ValueError, default: str) -> str:
    return exc.fix if isinstance(exc, RowProblem) else default


def _row(values: Mapping[str, Any], nodes: int | None, hours: float | None = None) -> Failure:
    """One failure; ``hours``: the scenario's length (a row at or past it would never be
    replayed: refused, not dropped)."""
    missing = [f for f in FIELDS if values.get(f) in (None, "")]
    if missing:
        raise ValueError(f"missing {', '.join(missing)}; give all of {', '.join(FIELDS)}")
    try:
        time = float(values["time_hours"])
        repair = float(values["repair_hours"])
    except (TypeError, ValueError):
        raise ValueError("time_hours and repair_hours must be numbers") from None
    if not (math.isfinite(time) and 0 <= time < MAX_HOURS):
        raise ValueError(f"time_hours {values['time_hours']!r} must be a number >= 0 and under {MAX_HOURS:g}")
    if not (math.isfinite(repair) and repair >= 0):
        raise ValueError(f"repair_hours {values['repair_hours']!r} must be a number >= 0")
    if hours is not None and time >= hours:
        days = math.floor(time / 24) + 1
        raise RowProblem(
            f"time_hours {time:g} is past the scenario's end ({hours:g} h: its days x 24), so it would"
            " never be replayed",
            f"set the scenario's days to {days} or more, pass --span-trace, or remove the row",
        )
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


def parse_csv(text: str, source: str, nodes: int | None = None, hours: float | None = None) -> list[Failure]:
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
            failures.append(_row(dict(zip(names, cells, strict=True)), nodes, hours))
        except ValueError as exc:
            problems.append(SpecProblem(f"line {number}", str(exc), _fix(exc, "correct or remove the row")))
    if problems:
        raise SpecError(source, problems)
    return sorted(failures)


def parse_json(text: str, source: str, nodes: int | None = None, hours: float | None = None) -> list[Failure]:
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
            failures.append(_row(row, nodes, hours))
        except ValueError as exc:
            problems.append(
                SpecProblem(f"failures[{index}]", str(exc), _fix(exc, "correct or remove the entry"))
            )
    if problems:
        raise SpecError(source, problems)
    return sorted(failures)


def parse_trace(
    text: str, source: str, nodes: int | None = None, hours: float | None = None
) -> list[Failure]:
    """Parse CSV or JSON (by the file name's ending, else by its first character); ``hours``:
    the scenario's length, which every row must fall within."""
    if source.endswith(".json") or (not source.endswith(".csv") and text.lstrip()[:1] in "[{"):
        return parse_json(text, source, nodes, hours)
    return parse_csv(text, source, nodes, hours)


def spanned_days(failures: list[Failure], days: float) -> float:
    """A scenario's days lengthened, if need be, to replay every failure (whole days)."""
    last = max((f.time_hours for f in failures), default=0.0)
    return float(max(days, math.floor(last / 24) + 1))


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

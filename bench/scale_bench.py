"""The control plane at cluster scale: N simulated agents (``bench/fleet.py``: the real agent
protocol over HTTP, no workers) heartbeating at the interval the coordinator gives them,
against one coordinator, with its state in SQLite and in etcd (a one-member etcd on loopback).

Per N and backend, ``RUNS`` runs each, every run reported: heartbeat latency p50/p99 (measured by
the agents, over a window after every agent registered), the coordinator's CPU over that window
(cores: its process's user + system time / wall time), false node losses (must be 0), the losses
it held back (``node_loss_held``: a mass silence, or the loss rate; ``control/detect/silence.py``)
and the mass silences it saw, and the detection time of one agent that goes silent at the end
(its last answered beat to the ``node_lost`` event; target: within the heartbeat deadline in effect
for that many nodes, ``core/cadence.py``, plus ``DETECTION_MARGIN_S``). A cell meets its targets
only if every run does (the p99 target holds up to ``P99_UP_TO`` agents; past it, p99 is
reported).
The agents run in ``PROCESSES`` processes on this same 2-core machine, so they take CPU from
the coordinator: the latencies are an upper bound.

Writes docs/bench/scale.json and docs/scale.md (``python -m bench.scale_bench [N ...] [--runs R]``;
``--docs`` rewrites the page from the last JSON).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from bench import fleet
from harness.etcdlocal import EtcdCluster, etcd_binary
from unicron.control.launch.localcluster import LocalCluster
from unicron.control.store.gcpolicy import GcPolicy
from unicron.core.cadence import cadence_for
from unicron.core.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
COUNTS = (1024, 2048, 4096)
RUNS = 3  # of each cell: every run is reported, and a cell is met only if all are
P99_UP_TO = 2048  # the p99 target holds up to this many agents; past it p99 is reported only
PROCESSES = 2  # agent processes (one event loop each)
SETTLE_S = 15.0  # after the last registration, before the window (the registrations' plans)
WINDOW_S = 20.0
SILENT_EXTRA_S = 5.0  # after the window, past the silent agent's deadline: its detection
# A silent node is found within its deadline (which grows with the node count: core/cadence.py)
# and this: the coordinator's tick, and a heartbeat's worth of the loop's lateness.
DETECTION_MARGIN_S = 1.0
TARGETS = {"p99_s": 0.1, "cores": 1.0, "detection_margin_s": DETECTION_MARGIN_S, "false_losses": 0}


def quantile(values: list[float], q: float) -> float | None:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else None


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def node_events(cluster: LocalCluster, kind: str) -> list[dict[str, Any]]:
    found, since = [], 0
    while page := cluster.get("/v1/events", since=since, limit=1000):
        found += [e for e in page if e["kind"] == kind]
        since = page[-1]["id"]
    return found


def answered(
    read: Callable[[], list[dict[str, Any]]], within_s: float = 180.0
) -> list[dict[str, Any]] | None:
    """``read()`` once the coordinator answers again (an overloaded one works through its
    backlog first); None if it does not within ``within_s``."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            return read()
        except httpx.HTTPError:
            time.sleep(2.0)
    return None


def one(root: Path, backend: str, count: int) -> dict[str, Any]:
    etcd = EtcdCluster(root / "etcd").start() if backend == "etcd" else None
    try:
        with LocalCluster(root / "cluster", nodes=0, store=etcd.url if etcd else None) as cluster:
            assert cluster.coordinator is not None
            pid = cluster.coordinator.pid
            start = time.time()
            window_from = start + SETTLE_S + count / 400  # registrations take a while at large N
            silent_at = window_from + WINDOW_S
            until = silent_at + cadence_for(count, Settings()).deadline_s + SILENT_EXTRA_S
            silent = "a0-00000"
            fleets = []
            for k in range(PROCESSES):
                out = root / f"fleet-{k}.json"
                argv = [sys.executable, "-m", "bench.fleet", "--url", cluster.urls[0]]
                argv += ["--state-dir", str(root / "cluster" / "coordinator"), "--prefix", f"a{k}-"]
                argv += ["--count", str(count // PROCESSES), "--until", str(until), "--out", str(out)]
                argv += ["--silent", silent, "--silent-at", str(silent_at)] if k == 0 else []
                fleets.append((subprocess.Popen(argv, cwd=ROOT), out))
            time.sleep(max(0.0, window_from - time.time()))
            cpu_from, wall_from = cpu_seconds(pid), time.monotonic()
            time.sleep(WINDOW_S)
            cores = (cpu_seconds(pid) - cpu_from) / (time.monotonic() - wall_from)
            for process, _ in fleets:
                process.wait(timeout=until - time.time() + 60)
            results = [json.loads(out.read_text()) for _, out in fleets]
            lost = answered(lambda: node_events(cluster, "node_lost"))
            held = answered(lambda: node_events(cluster, "node_loss_held"))
            mass = answered(lambda: node_events(cluster, "mass_silence"))
    finally:
        if etcd is not None:
            etcd.close()
    latencies = [lat for r in results for at, lat in r["latency"] if window_from <= at <= silent_at]
    last_beat = results[0]["silent_last_beat"]
    # The loss that followed its silence (an overloaded coordinator may have lost it before).
    found = [e["time"] for e in lost or [] if e["node"] == silent and last_beat and e["time"] >= last_beat]
    return {
        "backend": backend,
        "agents": count,
        "beats": len(latencies),
        "p50_s": round(statistics.median(latencies), 4) if latencies else None,
        "p99_s": round(p99, 4) if (p99 := quantile(latencies, 0.99)) is not None else None,
        "max_s": round(max(latencies), 4) if latencies else None,
        "failures": sum(r["failures"] for r in results),
        "cores": round(cores, 3),
        "agent_cores": round(sum(r["cores"] for r in results), 3),  # the simulated agents' (whole run)
        "false_losses": None if lost is None else len([e for e in lost if e["node"] != silent]),
        # ... by the simulated agents' process that ran them (its name's prefix, ``a0-``, ``a1-``)
        "false_losses_by_process": None
        if lost is None
        else dict(collections.Counter(e["node"].split("-", 1)[0] for e in lost if e["node"] != silent)),
        "held": None if held is None else len(held),
        "mass_silences": None if mass is None else len(mass),
        "detection_s": round(found[0] - last_beat, 3) if found and last_beat else None,
        "deadline_s": cadence_for(count, Settings()).deadline_s,
    }


def commit() -> str:
    """The commit measured (``+`` when the working tree's code differs from it)."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    changed = git("status", "--porcelain", "--", "src", "bench")
    return git("rev-parse", "--short", "HEAD") + ("+" if changed else "")


def misses(row: dict[str, Any]) -> list[str]:
    """The targets one run missed (p99 only up to ``P99_UP_TO`` agents)."""
    targets = {k: v for k, v in TARGETS.items() if k not in ("p99_s", "detection_margin_s")}
    if row["agents"] <= P99_UP_TO:
        targets["p99_s"] = TARGETS["p99_s"]
    if "deadline_s" in row:  # (rows measured before it was recorded have none)
        targets["detection_s"] = row["deadline_s"] + DETECTION_MARGIN_S
    return [k for k, limit in targets.items() if row.get(k) is None or not 0 <= row[k] <= limit]


def verdict(rows: list[dict[str, Any]]) -> str:
    """A cell's verdict: met only if every one of its runs met every target."""
    missed = sorted({k for r in rows for k in misses(r)})
    return "met" if not missed else "NOT met: " + ", ".join(missed)


def cells_of(result: dict[str, Any]) -> dict[tuple[str, int], list[dict[str, Any]]]:
    cells: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in result["rows"]:
        cells.setdefault((r["backend"], r["agents"]), []).append(r)
    return cells


def cliff(result: dict[str, Any]) -> str:
    """Where the targets stop holding, per backend, as the runs measured."""
    said = []
    for backend in sorted({r["backend"] for r in result["rows"]}):
        sizes = sorted((n, verdict(rows)) for (b, n), rows in cells_of(result).items() if b == backend)
        failed = [n for n, v in sizes if v != "met"]
        held = [n for n, v in sizes if v == "met"]
        if not failed:
            said.append(f"{backend}: every size measured ({', '.join(str(n) for n, _ in sizes)} agents) met")
        else:
            met_below = [n for n in held if n < failed[0]]
            below = f"met up to {max(met_below)} agents, " if met_below else ""
            said.append(f"{backend}: {below}not met at {failed[0]} ({dict(sizes)[failed[0]]})")
    return "; ".join(said)


def spread(rows: list[dict[str, Any]], key: str, scale: float = 1.0, digits: int = 2) -> str:
    """A figure over a cell's runs: one value, or its least and most."""
    values = [r[key] * scale for r in rows if r.get(key) is not None]
    if not values:
        return "none"
    low, high = round(min(values), digits), round(max(values), digits)
    return f"{low:g}" if low == high else f"{low:g}-{high:g}"


def measured_at(result: dict[str, Any]) -> str:
    """Which commit measured which sizes (cells measured again later keep their own)."""
    sizes: dict[str, set[int]] = {}
    for r in result["rows"]:
        sizes.setdefault(r.get("commit", "unrecorded"), set()).add(r["agents"])
    listed = {c: ", ".join(f"{n:,}" for n in sorted(ns)) for c, ns in sorted(sizes.items())}
    return "; ".join(f"{c}: {ns} agents" for c, ns in listed.items())


def by_process(rows: list[dict[str, Any]]) -> str:
    """Each run's false losses by the simulated agents' process (``bench/fleet.py``) that ran them."""
    said = []
    for r in rows:
        counts = r.get("false_losses_by_process")
        if counts is None:
            said.append("not recorded")
        else:
            said.append(", ".join(f"{p} {n}" for p, n in sorted(counts.items())) or "none")
    return "; ".join(f"run {i}: {text}" for i, text in enumerate(said, 1))


def sizes_text(result: dict[str, Any]) -> str:
    """The sizes measured, by backend."""
    by_backend: dict[str, set[int]] = {}
    for r in result["rows"]:
        by_backend.setdefault(r["backend"], set()).add(r["agents"])
    return "; ".join(
        f"{b}: {', '.join(f'{n:,}' for n in sorted(ns))} agents" for b, ns in sorted(by_backend.items())
    )


def over_budget() -> int:
    """The least node count whose heartbeats the cadence cannot keep within ``heartbeat_rate_max``
    (its interval at its cap: ``core/cadence.py``), to the nearest hundred."""
    limits = Settings()
    widest = cadence_for(10**9, limits).interval_s
    return math.ceil(limits.heartbeat_rate_max * widest / 100) * 100


def past_cores(result: dict[str, Any]) -> str:
    """The simulated agents' cores at the first size any backend missed (``spread``)."""
    missed = sorted((n, rows) for (_, n), rows in cells_of(result).items() if verdict(rows) != "met")
    return spread(missed[0][1], "agent_cores") if missed else "none"


def past_cliff(result: dict[str, Any]) -> str:
    """What happened at the first size each backend missed its targets, as the runs measured."""
    said = []
    for backend in sorted({r["backend"] for r in result["rows"]}):
        cells = sorted((n, rows) for (b, n), rows in cells_of(result).items() if b == backend)
        missed = [(n, rows) for n, rows in cells if verdict(rows) != "met"]
        if not missed:
            continue
        n, rows = missed[0]
        found = [r for r in rows if r.get("detection_s") is not None and r["detection_s"] >= 0]
        said.append(
            f"{backend}, {n:,} agents ({len(rows)} runs): the agents' own processes took"
            f" {spread(rows, 'agent_cores')} of the machine's cores and the coordinator"
            f" {spread(rows, 'cores')}; heartbeats took {spread(rows, 'p50_s', 1000, 0)} ms at the median and"
            f" {spread(rows, 'p99_s', 1000, 0)} ms at the 99th percentile, {spread(rows, 'failures')} failed;"
            f" {spread(rows, 'false_losses')} healthy nodes declared lost, {spread(rows, 'held')} held,"
            f" {spread(rows, 'mass_silences')} mass-silence alarms; the silent agent was found in"
            f" {len(found)} of {len(rows)} runs; the nodes lost, by the agents' process that simulated"
            f" them: {by_process(rows)}"
        )
    return "; ".join(said) + "." if said else "no size measured missed its targets."


def cadence_text(counts: list[int]) -> str:
    """The heartbeat cadence for each size measured, as ``core/cadence.py`` sets it."""
    limits = Settings()
    base, rate = cadence_for(0, limits), limits.heartbeat_rate_max
    widest = cadence_for(10**9, limits)
    sizes = ", ".join(
        f"{c.interval_s:g} s and {c.deadline_s:g} s at {n:,}" for n in counts if (c := cadence_for(n, limits))
    )
    return (
        f"The interval is {base.interval_s:g} s (deadline {base.deadline_s:g} s) while the beats stay"
        f" within `heartbeat_rate_max`, {rate:,.0f} a second ({rate * base.interval_s:,.0f} nodes); past"
        f" that it grows with the node count, and the deadline with it, up to {widest.interval_s:g} s and"
        f" {widest.deadline_s:g} s (`core/cadence.py`): {sizes} nodes."
    )


def write_docs(result: dict[str, Any]) -> None:
    lines = [
        "| backend | agents | run | heartbeats | p50 (ms) | p99 (ms) | max (ms) | failed | coordinator cores "
        "| agent cores | false losses | held | mass silences | detection (s) | cell |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (_, _), rows in sorted(cells_of(result).items(), key=lambda kv: (kv[0][1], kv[0][0])):
        cell = verdict(rows)
        for r in rows:
            ms = [f"{r[k] * 1000:.1f}" if r[k] is not None else "-" for k in ("p50_s", "p99_s", "max_s")]
            found = r["detection_s"] is not None and r["detection_s"] >= 0  # (lost before its silence: not)
            detection = r["detection_s"] if found else "not found"
            cells = [r["backend"], r["agents"], r.get("run", 1), r["beats"], *ms, r["failures"]]
            cells += [f"{r['cores']:.2f}", f"{r['agent_cores']:.2f}"]
            losses = "no answer" if r["false_losses"] is None else r["false_losses"]
            cells += [losses, r.get("held", "-"), r.get("mass_silences", "-"), detection, cell]
            lines.append("| " + " | ".join(map(str, cells)) + " |")
    template = (Path(__file__).parent / "templates" / "scale.md").read_text()
    text = template.replace("{table}", "\n".join(lines)).replace("{cliff}", cliff(result))
    text = text.replace("{past_cliff}", past_cliff(result)).replace("{commits}", measured_at(result))
    text = text.replace("{sizes}", sizes_text(result)).replace("{processes}", str(result.get("processes", 2)))
    text = text.replace("{over_budget:,}", f"{over_budget():,}")
    text = text.replace("{past_agent_cores}", past_cores(result))
    text = text.replace("{p99_up_to}", f"{result.get('p99_up_to', P99_UP_TO):,}")
    text = text.replace("{cadence}", cadence_text(sorted({r["agents"] for r in result["rows"]})))
    gc = GcPolicy()
    text = text.replace("{gc_freeze_s}", f"{gc.freeze_every_s:g}")
    text = text.replace("{gc_full_s}", f"{gc.full_every_s:,.0f}")
    text = text.replace("{window_s}", f"{result.get('window_s', WINDOW_S):g}")
    text = text.replace("{margin_s}", f"{DETECTION_MARGIN_S:g}").replace("{cores}", f"{TARGETS['cores']:g}")
    text = text.replace("{p99_ms}", f"{TARGETS['p99_s'] * 1000:g}").replace(
        "{poll_s}", f"{fleet.POLL_WAIT_S:g}"
    )
    text = text.replace("{timeout_s}", f"{fleet.TIMEOUT_S:g}").replace(
        "{cpus}", str(result.get("cpus", os.cpu_count()))
    )
    (ROOT / "docs" / "scale.md").write_text(text.replace("{runs}", str(result.get("runs", 1))))


def main(
    counts: tuple[int, ...] = COUNTS, runs: int = RUNS, keep: bool = False, backends: list[str] | None = None
) -> dict[str, Any]:
    """Measure ``counts`` on ``backends`` (both where etcd is installed); ``keep``: the rows of
    the other cells in docs/bench/scale.json stay (one size measured again, or one added)."""
    backends = backends or ["sqlite"] + (["etcd"] if etcd_binary() else [])
    measured = {(b, n) for b in backends for n in counts}
    rows = []
    if keep:
        kept = json.loads((ROOT / "docs" / "bench" / "scale.json").read_text())
        same = (kept.get("runs"), kept.get("window_s"), kept.get("processes")) == (runs, WINDOW_S, PROCESSES)
        if not same:
            sys.exit("--keep: the JSON's cells were measured with other runs, window or agent processes")
        rows = [r for r in kept["rows"] if (r["backend"], r["agents"]) not in measured]
    with tempfile.TemporaryDirectory(prefix="unicron-scale-") as tmp:
        for count in counts:
            for backend in backends:
                for run in range(1, runs + 1):
                    measuring = commit()  # (the processes import the code as they start)
                    measured_row = one(Path(tmp) / f"{backend}-{count}-{run}", backend, count)
                    rows.append({"run": run, "commit": measuring, **measured_row})
                    print(json.dumps(rows[-1]), flush=True)
    result = {"window_s": WINDOW_S, "processes": PROCESSES, "runs": runs, "targets": TARGETS, "rows": rows}
    result["cpus"] = os.cpu_count()
    result["p99_up_to"] = P99_UP_TO
    (ROOT / "docs" / "bench" / "scale.json").write_text(json.dumps(result, indent=2) + "\n")
    write_docs(result)
    return result


if __name__ == "__main__":
    if sys.argv[1:] == ["--docs"]:  # the page again from the last measured figures (a text change)
        write_docs(json.loads((ROOT / "docs" / "bench" / "scale.json").read_text()))
    else:
        parser = argparse.ArgumentParser(prog="python -m bench.scale_bench")
        parser.add_argument("sizes", nargs="*", type=int, help=f"agents per cell (default {COUNTS})")
        parser.add_argument("--runs", type=int, default=RUNS)
        parser.add_argument("--backend", action="append", choices=["sqlite", "etcd"], help="(default: both)")
        parser.add_argument("--keep", action="store_true", help="keep the JSON's rows of other cells")
        args = parser.parse_args()
        main(tuple(args.sizes) or COUNTS, args.runs, args.keep, args.backend)

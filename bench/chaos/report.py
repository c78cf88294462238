"""The soak's record (docs/bench/chaos.json) and page (docs/reliability.md)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.chaos import check
from unicron.train.checkpoint import load_latest

if TYPE_CHECKING:
    from bench.chaos.soak import Soak

ROOT = Path(__file__).resolve().parents[2]
FD_SLACK = 16  # descriptors a service may hold more at the end (pooled connections)


def task_result(
    soak: Soak, task: dict[str, Any], events: list[dict[str, Any]], want: dict[str, Any]
) -> dict[str, Any]:
    name = task["name"]
    mine = [e for e in events if e["task"] == name]
    launched = [e["detail"]["generation"] for e in mine if e["kind"] == "task_launch"]
    trace = soak.root / "traces" / f"{name}.jsonl"
    rows = [json.loads(line) for line in trace.read_text().splitlines()] if trace.exists() else []
    book = check.ledger(rows, task["iterations"])
    try:
        final = load_latest(soak.root / "cluster" / "checkpoints" / name)
    except Exception:  # a torn final checkpoint: not exact
        final = None
    return {
        "name": name,
        "weight": soak.submitted.get(name),
        "state": task["state"],
        "step": task["step"],
        "finished": task["state"] == "finished" and task["step"] == task["iterations"],
        "exact": check.same_state(final, want),
        "ledger_ok": book.ok,
        "ledger": {"steps_exact": book.steps_exact, "steps_short": book.steps_short, "wrong": book.wrong},
        "incidents": sum(e["kind"] == "incident" for e in mine),
        "launches": len(launched),
    }


def summary(
    soak: Soak,
    tasks: list[dict[str, Any]],
    events: list[dict[str, Any]],
    want: dict[str, Any],
    leaks: dict[str, Any],
    elapsed_s: float,
) -> dict[str, Any]:
    from bench.chaos.soak import SETTINGS, fd_growth

    results = [task_result(soak, t, events, want) for t in tasks]
    outside = Counter(s["kind"] for s in soak.strikes if s["target"] is not None)
    inside = Counter(e["detail"]["action"] for e in events if e["kind"] == "fault_injected")
    outcomes = [e["detail"] for e in events if e["kind"] == "outcome"]
    closed = {o["incident"] for o in outcomes}
    leaks["fd_growth"] = fd_growth(leaks["fds"])
    leaked = bool(leaks["processes"] or leaks["listening_ports"] or leaks["shared_memory"])
    leaked = leaked or leaks["fd_growth"] > FD_SLACK
    return {
        "seed": soak.seed,
        "minutes": soak.minutes,
        "elapsed_s": round(elapsed_s, 1),
        "settings": SETTINGS,
        "faults_injected": {
            **{f"outside:{k}": v for k, v in sorted(outside.items())},
            **{f"worker:{k}": v for k, v in sorted(inside.items())},
        },
        "faults_total": sum(outside.values()) + sum(inside.values()),
        "recovered_by_tier": dict(
            sorted(Counter(o.get("action", "?") for o in outcomes if o["outcome"] == "recovered").items())
        ),
        "superseded": sum(o["outcome"] == "superseded" for o in outcomes),
        "incidents_open": [e["id"] for e in events if e["kind"] == "incident" and e["id"] not in closed],
        "tasks_submitted": len(results),
        "tasks_finished": sum(r["finished"] for r in results),
        "tasks_exact": sum(r["exact"] for r in results),
        "tasks_ledger_ok": sum(r["ledger_ok"] for r in results),
        "leaks": leaks,
        "leaked": leaked,
        "ok": all(r["finished"] and r["exact"] and r["ledger_ok"] for r in results)
        and not leaked
        and all(e["id"] in closed for e in events if e["kind"] == "incident"),
        "strikes": soak.strikes,
        "tasks": results,
    }


def write(result: dict[str, Any]) -> None:
    (ROOT / "docs" / "bench" / "chaos.json").write_text(json.dumps(result, indent=2) + "\n")
    template = (Path(__file__).parents[1] / "templates" / "reliability.md").read_text()
    faults = "\n".join(f"| {k} | {v} |" for k, v in result["faults_injected"].items())
    tiers = "\n".join(f"| {k} | {v} |" for k, v in result["recovered_by_tier"].items())
    leaks = result["leaks"]
    (ROOT / "docs" / "reliability.md").write_text(
        template.format(
            **{k: v for k, v in result.items() if not isinstance(v, (dict, list))},
            faults=faults,
            tiers=tiers,
            processes=len(leaks["processes"]),
            ports=len(leaks["listening_ports"]),
            shm=len(leaks["shared_memory"]),
            fd_growth=leaks["fd_growth"],
            open=len(result["incidents_open"]),
            verdict="passed" if result["ok"] else "FAILED",
        )
    )

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
    from bench.chaos.soak import fd_growth

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
        "tasks_failed": sum(r["state"] == "failed" for r in results),
        "nodes_isolated": sum(e["kind"] == "node_isolated" for e in events),
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
    """Record ``result`` (the soak's own settings: chaos.json; the ladder's defaults:
    chaos-defaults.json) and write the page from both records."""
    bench = ROOT / "docs" / "bench"
    name = "chaos.json" if result.get("ladder", "soak") == "soak" else "chaos-defaults.json"
    (bench / name).write_text(json.dumps(result, indent=2) + "\n")
    main = json.loads((bench / "chaos.json").read_text())
    template = (Path(__file__).parents[1] / "templates" / "reliability.md").read_text()
    faults = "\n".join(f"| {k} | {v} |" for k, v in main["faults_injected"].items())
    tiers = "\n".join(f"| {k} | {v} |" for k, v in main["recovered_by_tier"].items())
    leaks = main["leaks"]
    (ROOT / "docs" / "reliability.md").write_text(
        template.format(
            **{k: v for k, v in main.items() if not isinstance(v, (dict, list))},
            faults=faults,
            tiers=tiers,
            processes=len(leaks["processes"]),
            ports=len(leaks["listening_ports"]),
            shm=len(leaks["shared_memory"]),
            fd_growth=leaks["fd_growth"],
            open=len(main["incidents_open"]),
            verdict="passed" if main["ok"] else "FAILED",
            defaults=defaults_section(bench / "chaos-defaults.json"),
        )
    )


def defaults_section(path: Path) -> str:
    """The soak with the ladder's default settings, in a paragraph (or that it was not run)."""
    if not path.exists():
        return "Not run yet (`python -m bench.chaos --ladder defaults`)."
    r = json.loads(path.read_text())
    tiers = ", ".join(f"{k} {v}" for k, v in r["recovered_by_tier"].items()) or "none"
    isolated = r.get("nodes_isolated", "?")
    return (
        f"**Verdict: {'passed' if r['ok'] else 'FAILED'}** (seed {r['seed']}, {r['minutes']} minutes, "
        f"{r['faults_total']} faults in {r['elapsed_s']} s): {r['tasks_finished']} of "
        f"{r['tasks_submitted']} tasks finished, {r['tasks_exact']} exact, {r['tasks_ledger_ok']} with a "
        f"clean sample ledger; {r['tasks_failed']} failed by the ladder; {isolated} node isolations; "
        f"incidents recovered by tier: {tiers}; {len(r['incidents_open'])} left open."
    )

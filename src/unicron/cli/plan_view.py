"""``unicron plan``: the plan for now or for a given event, as a table or JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from unicron.cli.console import console as make_console
from unicron.cli.files import load_specs
from unicron.core.errors import SpecError, SpecProblem
from unicron.core.events import parse_event
from unicron.planning.planner import ClusterState, Plan
from unicron.planning.plantable import PlanTable, build


def plan_json(chosen: Plan, table: PlanTable) -> dict[str, Any]:
    return {
        "event": chosen.event,
        "plan": chosen.allocation(),
        "waf": chosen.waf,
        "objective": chosen.objective,
        "capacity_gpus": chosen.capacity_gpus,
        "run_duration_s": chosen.run_duration_s,
        "unit_gpus": chosen.unit_gpus,
        "solve_s": chosen.solve_s,
        "table_build_s": table.build_s,
        "tasks": [
            {
                "name": d.task,
                "weight": d.weight,
                "before": d.before,
                "after": d.after,
                "waf_before": d.waf_before,
                "waf_after": d.waf_after,
                "transition_s": d.transition_s,
                "hit": d.hit,
                "reason": d.reason,
            }
            for d in chosen.decisions
        ],
    }


def render(chosen: Plan, table: PlanTable, console: Console) -> None:
    view = Table(title=f"Plan for event: {chosen.event}", title_justify="left")
    view.add_column("task")
    view.add_column("weight", justify="right")
    view.add_column("workers", justify="center")
    view.add_column("WAF (PFLOP/s)", justify="right")
    view.add_column("why")
    for d in chosen.decisions:
        arrow = f"{d.before} -> {d.after}"
        style = "" if d.before == d.after and not d.hit else "bold"
        view.add_row(d.task, f"{d.weight:g}", arrow, f"{d.waf_after / 1e15:.2f}", d.reason, style=style)
    console.print(view)
    console.print(
        f"cluster WAF {chosen.waf / 1e15:.2f} PFLOP/s on {chosen.capacity_gpus} GPUs; "
        f"objective {chosen.objective:.4g} FLOP over an expected "
        f"{chosen.run_duration_s / 3600:.1f} h to the next failure; "
        f"table of {table.distinct_solves} plans built in {table.build_s * 1e3:.0f} ms"
    )


def run_plan(cluster_path: Path, tasks_path: Path, *, json_output: bool, event: str | None) -> None:
    cluster, tasks = load_specs(cluster_path, tasks_path)
    try:
        state = ClusterState.from_specs(cluster, tasks)
    except ValueError as exc:
        raise SpecError(
            str(tasks_path), [SpecProblem("tasks[*].current_workers", str(exc), "lower them")]
        ) from None
    table = build(state)
    chosen = table.now if event is None else table.lookup(parse_event(event))
    if json_output:
        print(json.dumps(plan_json(chosen, table), indent=2))
    else:
        render(chosen, table, make_console())

"""``unicron plan``: the plan for now or for a given event, as a table or JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from unicron.cli.console import console as make_console
from unicron.cli.files import load_specs, read_text
from unicron.core.errors import SpecError, SpecProblem, UnicronError, UsageError
from unicron.core.events import NodeBack, PlanEvent, TaskDone, parse_event
from unicron.core.safeyaml import load_yaml_text
from unicron.core.specs import TaskSpec
from unicron.planning.planner import ClusterState, Plan
from unicron.planning.plantable import PlanTable, build

USAGE = "usage: unicron plan CLUSTER.yaml TASKS.yaml (the cluster's nodes and GPUs, then the tasks)"


def check_order(cluster_path: Path, tasks_path: Path) -> None:
    """One clear error for files given in the wrong places (each would otherwise be checked
    against the other's fields: five "Field required" and an "Extra inputs")."""

    def keys(path: Path) -> set[str]:
        try:
            data = load_yaml_text(read_text(path), str(path))
        except UnicronError:
            return set()  # unreadable or not YAML: the ordinary checks say so
        return {str(k) for k in data} if isinstance(data, dict) else set()

    cluster, tasks = keys(cluster_path), keys(tasks_path)
    holds_tasks, holds_cluster = "tasks" in cluster and "nodes" not in cluster, "nodes" in tasks
    if holds_tasks and holds_cluster:
        raise UsageError(
            f"the two files are swapped: {tasks_path} is the cluster, {cluster_path} the tasks; {USAGE}"
        )
    if holds_tasks:
        raise UsageError(f"{cluster_path} holds tasks, where the cluster file goes; {USAGE}")
    if holds_cluster and "tasks" not in tasks:
        raise UsageError(f"{tasks_path} holds a cluster, where the tasks file goes; {USAGE}")


def idle_gpus(chosen: Plan, tasks: list[TaskSpec], event: PlanEvent | None) -> tuple[int, list[str]]:
    """The GPUs the plan leaves idle and, for each task that could take them, why it does not."""
    allocation = chosen.allocation()
    idle = chosen.capacity_gpus - sum(allocation.values())
    if idle <= 0:
        return 0, []
    done = event.task if isinstance(event, TaskDone) else None
    why = []
    for t in tasks:
        after = allocation.get(t.name, 0)
        if t.name == done:
            continue
        if t.max_workers is not None and after >= t.max_workers:
            why.append(f"{t.name} has its max_workers ({t.max_workers})")
        elif not any(t.is_usable(after + extra) for extra in range(1, idle + 1)):
            why.append(
                f"{t.name} runs on no count from {after + 1} to {after + idle} ({t.describe_usable()})"
            )
        else:
            why.append(f"{t.name} would not gain enough from more (its throughput, or the cost of the move)")
    return idle, why


def node_back_note(chosen: Plan, table: PlanTable, event: PlanEvent | None) -> str | None:
    """What ``node-back`` plans for when no node of the cluster is out: a node beyond its size."""
    if not isinstance(event, NodeBack):
        return None
    node = table.state.returning_node(event)
    size = len(table.state.healthy) + len(table.state.down)
    if node in table.state.down:
        return None
    return (
        f"every node of the cluster ({size}) is in service, so node-back plans for a node joining "
        f"beyond its size: node {node}, {chosen.capacity_gpus} GPUs in all"
    )


def plan_json(
    chosen: Plan, table: PlanTable, tasks: list[TaskSpec], event: PlanEvent | None
) -> dict[str, Any]:
    idle, why = idle_gpus(chosen, tasks, event)
    return {
        "event": chosen.event,
        "note": node_back_note(chosen, table, event),
        "idle_gpus": idle,
        "idle_why": why,
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


def render(
    chosen: Plan,
    table: PlanTable,
    console: Console,
    tasks: list[TaskSpec],
    event: PlanEvent | None,
) -> None:
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
        f"table of {table.distinct_solves} plans built in {table.build_s * 1e3:.0f} ms",
        highlight=False,
    )
    idle, why = idle_gpus(chosen, tasks, event)
    if idle:
        console.print(f"{idle} of the {chosen.capacity_gpus} GPUs left idle: {'; '.join(why)}", markup=False)
    if (note := node_back_note(chosen, table, event)) is not None:
        console.print(f"note: {note}", markup=False, highlight=False)


def run_plan(cluster_path: Path, tasks_path: Path, *, json_output: bool, event: str | None) -> None:
    check_order(cluster_path, tasks_path)
    cluster, tasks = load_specs(cluster_path, tasks_path)
    try:
        state = ClusterState.from_specs(cluster, tasks)
    except ValueError as exc:
        raise SpecError(
            str(tasks_path), [SpecProblem("tasks[*].current_workers", str(exc), "lower them")]
        ) from None
    table = build(state)
    what = None if event is None else parse_event(event)
    chosen = table.now if what is None else table.lookup(what)
    if json_output:
        print(json.dumps(plan_json(chosen, table, tasks, what), indent=2))
    else:
        render(chosen, table, make_console(), tasks, what)

"""What a plan does to each task, as values (``control/place/moves.py:parts_of``): hand-built
snapshots, the plan's decisions and the slots processes hold; no store, no processes."""

from __future__ import annotations

from dataclasses import replace

from unicron.brain.effects import Launch, Launched, Record, StopGeneration, Stopping
from unicron.brain.snapshot import Snapshot
from unicron.control.place.moves import (
    MoveKind,
    TaskFacts,
    launch_effects,
    parts_of,
    restart_effects,
    wanted_by_task,
)
from unicron.core.states import TaskState
from unicron.planning.planner import Decision

from .test_response import anything, node, snapshot, task

IN_PLACE = TaskFacts(in_place=True, growing=False, usable=anything)


def decided(name: str, before: int, after: int) -> Decision:
    return Decision(name, 1.0, before, after, 0.0, 0.0, 0.0, False, f"{name} to {after}")


def cluster() -> Snapshot:
    """lm runs 4 ranks on nodes a and b (2 slots each); node c (2 slots) is empty; x and y wait
    for workers."""
    lm = snapshot()
    waiting = replace(task(), state=TaskState.WAITING, workers=0)
    return Snapshot(
        tasks={**lm.tasks, "x": replace(waiting, name="x"), "y": replace(waiting, name="y")},
        nodes={**lm.nodes, "c": node("c")},
        members=lm.members,
        next_generation={"lm": 6, "x": 1, "y": 1},
    )


def test_the_layout_becomes_each_tasks_nodes_by_name() -> None:
    layout = {0: {"lm": 2, "x": 0}, 2: {"x": 2, "lm": 1}}
    assert wanted_by_task(layout, {0: "a", 2: "c"}) == {"lm": {"a": 2, "c": 1}, "x": {"c": 2}}


def test_new_processes_start_only_where_they_fit_in_the_plans_order() -> None:
    """x and y are both placed on c; c has one slot held (a stopped process still exiting): x's
    two do not fit, so x waits, and so does y; freed, x launches and y, placed after it, waits."""
    plan = (decided("lm", 4, 4), decided("x", 0, 2), decided("y", 0, 2))
    wanted = {"lm": {"a": 2, "b": 2}, "x": {"c": 2}, "y": {"c": 2}}
    facts = dict.fromkeys(("lm", "x", "y"), IN_PLACE)
    held = parts_of(plan, wanted, cluster(), facts, {"a": 2, "b": 2, "c": 1})
    assert [(p.decision.task, p.move.kind) for p in held.now] == [("lm", MoveKind.KEEP)]
    assert held.waiting == ("x", "y")
    free = parts_of(plan, wanted, cluster(), facts, {"a": 2, "b": 2})
    assert [(p.decision.task, p.move.kind, p.wanted) for p in free.now] == [
        ("lm", MoveKind.KEEP, {"a": 2, "b": 2}),
        ("x", MoveKind.LAUNCH, {"c": 2}),
    ]
    assert free.waiting == ("y",)


def test_a_grow_counts_the_slots_its_spares_hold_as_its_own() -> None:
    """lm grows by 2 onto c, where its hot spare already holds one of the two slots: one new
    process starts, and it fits; without the spare, two would not fit beside that process."""
    plan = (decided("lm", 4, 6),)
    wanted = {"lm": {"a": 2, "b": 2, "c": 2}}
    spare = replace(IN_PLACE, spare_nodes=("c",))
    grow = parts_of(plan, wanted, cluster(), {"lm": spare}, {"a": 2, "b": 2, "c": 1})
    assert [(p.move.kind, p.move.extra) for p in grow.now] == [(MoveKind.GROW, {"c": 2})]
    assert parts_of(plan, wanted, cluster(), {"lm": IN_PLACE}, {"a": 2, "b": 2, "c": 1}).waiting == ("lm",)


def test_a_task_that_ended_is_no_part_and_one_that_relaunches_needs_no_new_slots_now() -> None:
    """A table's answer to a task's end still names it: no part. A task that cannot move in place
    stops first (its relaunch is a later plan's launch): it needs no slot now."""
    plan = (decided("gone", 2, 0), decided("lm", 4, 6))
    wanted = {"lm": {"a": 1, "b": 2, "c": 3}}  # members move: not reachable by adding newcomers
    parts = parts_of(plan, wanted, cluster(), {"lm": IN_PLACE}, {"a": 2, "b": 2, "c": 2})
    assert [(p.decision.task, p.move.kind) for p in parts.now] == [("lm", MoveKind.RESTART)]
    assert parts.waiting == ()


def test_a_restart_the_plan_decides_stops_the_generation_and_waits_to_relaunch() -> None:
    said, stop, stopping = restart_effects(task(), 6, "lm to 6", grace_s=30.0)
    assert said == Record("task_resize", "lm", None, {"before": 4, "after": 6, "reason": "lm to 6"})
    assert stop == StopGeneration("lm", 3, 30.0) and stopping == Stopping("lm")


def test_a_launch_starts_the_placed_ranks_makes_them_current_and_says_from_which_step() -> None:
    served = replace(task(), state=TaskState.WAITING, workers=0, checkpoint_step=20, store_port=4100)
    env = {"UNICRON_STORE": "host:4100"}
    start, current, said = launch_effects(served, 6, {"c": 2, "a": 1}, "x to 3", ["train.py"], env)
    assert start == Launch("lm", 6, 3, {"c": 2, "a": 1}, 0, ["train.py"], env)
    assert current == Launched("lm", 6, 3, 4100)  # on the port the store was served on
    detail = {
        "generation": 6,
        "workers": 3,
        "placement": {"c": 2, "a": 1},
        "resume_from": 20,
        "reason": "x to 3",
    }
    assert said == Record("task_launch", "lm", None, detail)

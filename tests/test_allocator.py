"""The coordinator's planner front (table lookups and their fallbacks) and the rate meter."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from unicron.control.act.happened import Happened, net
from unicron.control.coordinator import Coordinator, CoordinatorSettings
from unicron.control.place import allocator as allocator_module
from unicron.control.place.allocator import MAX_RESTARTS, Allocator, Decided, laid_out, same_workers
from unicron.control.place.rates import RateMeter
from unicron.core.events import NodeBack, NodeLost, TaskDone, TasksArrived, named
from unicron.core.gpus import lookup_gpu
from unicron.core.livespecs import LiveClusterSpec, parse_live_tasks
from unicron.core.protocol import Heartbeat, IterationReport, Registration
from unicron.core.specs import ClusterSpec, TaskSpec
from unicron.core.states import NodeState
from unicron.planning.gpt import flops_per_sample
from unicron.planning.placement import place
from unicron.planning.planner import ClusterState, Plan, plan
from unicron.planning.plantable import PlanTable, build
from unicron.planning.throughput import curve_for


def demo_state() -> ClusterState:
    """The demo's cluster (4 nodes x 2 slots) and tasks, as the optimum placed them."""
    tasks = [
        TaskSpec(name="alpha", weight=3, throughput={2: 2.0e9, 4: 3.8e9}),
        TaskSpec(name="beta", weight=2, throughput={2: 2.0e9, 4: 2.6e9}),
        TaskSpec(name="gamma", weight=1, throughput={2: 2.0e9, 4: 3.0e9}),
    ]
    cluster = ClusterSpec(nodes=4, gpus_per_node=2, gpu=1e12, node_mtbf_hours=1000)
    state = ClusterState.from_specs(cluster, tasks)
    best = plan(state)
    return replace(state, assignment=place(best.allocation(), state.healthy, 2, {}), next_node=4)


def after_loss(state: ClusterState, node: int) -> ClusterState:
    """The cluster right after ``node`` was lost, before anything moved."""
    return replace(
        state,
        healthy=tuple(n for n in state.healthy if n != node),
        assignment={n: dict(a) for n, a in state.assignment.items() if n != node},
    )


@pytest.fixture
def allocator() -> Iterator[Allocator]:
    a = Allocator()
    yield a
    a.close()


def decide(allocator: Allocator, state: ClusterState, curves_version: int) -> Decided:
    """The allocator's plan for ``state``: a lookup at once, or a solve (run in the background)
    waited for; the table being built is not waited for."""
    decided = allocator.decide(state, curves_version)
    if decided is None:
        assert allocator.solving is not None
        allocator.solving.future.result(30)
        decided = allocator.decide(state, curves_version)
    assert decided is not None
    return decided


def settle(allocator: Allocator, state: ClusterState) -> None:
    decided = decide(allocator, state, 0)
    allocator.refresh(state, decided, 0)
    allocator.wait()


def test_optimum_places_the_demo_as_documented() -> None:
    state = demo_state()
    assert plan(state).allocation() == {"alpha": 4, "beta": 2, "gamma": 2}


def test_node_loss_is_answered_from_the_table(allocator: Allocator) -> None:
    state = demo_state()
    settle(allocator, state)
    gamma_node = next(n for n, a in state.assignment.items() if "gamma" in a)
    now = after_loss(state, gamma_node)
    allocator.happened.note(NodeLost(gamma_node))  # (as the actuator notes it)
    decided = decide(allocator, now, 0)
    assert decided.source == "table" and decided.event == NodeLost(gamma_node)
    assert decided.plan.allocation() == plan(state, NodeLost(gamma_node)).allocation()
    # Three nodes: gamma (the lowest weight per slot) gives way.
    assert decided.plan.allocation() == {"alpha": 4, "beta": 2, "gamma": 0}
    assert sum(decided.layout[n].get("alpha", 0) for n in decided.layout) == 4


def test_a_node_loss_is_looked_up_also_when_a_recovery_moved_workers_first(allocator: Allocator) -> None:
    """A task that recovers by relaunching stops every worker when its node is lost, before the
    plan: the event is still the node loss, answered from the table (before: "workers changed
    beyond the event", solved). Its plan is laid out over the workers as they are."""
    state = demo_state()
    settle(allocator, state)
    alpha_node = next(n for n, a in state.assignment.items() if "alpha" in a)
    now = after_loss(state, alpha_node)
    now = replace(
        now, assignment={n: {t: c for t, c in a.items() if t != "alpha"} for n, a in now.assignment.items()}
    )
    allocator.happened.note(NodeLost(alpha_node))
    decided = decide(allocator, now, 0)
    assert decided.source == "table" and decided.event == NodeLost(alpha_node)
    assert decided.plan.allocation() == plan(state, NodeLost(alpha_node)).allocation()
    assert "laid out anew" in decided.why
    assert sum(per.get("alpha", 0) for per in decided.layout.values()) == decided.plan.allocation()["alpha"]


def test_a_plan_laid_out_anew_says_what_it_does_to_the_workers_as_they_are(allocator: Allocator) -> None:
    """A crash left alpha on 2 of its 4 workers (survivors re-formed in place): the table's plan
    (alpha on 4) grows it back, and says so; it is not "unchanged" (the table's state had 4).
    A task the event itself hit keeps the event's words."""
    state = demo_state()
    settle(allocator, state)
    crashed = {n: dict(a) for n, a in state.assignment.items()}
    node = next(n for n, a in crashed.items() if "alpha" in a)
    del crashed[node]["alpha"]
    decided = decide(allocator, replace(state, assignment=crashed), 0)
    assert decided.source == "table" and "laid out anew" in decided.why
    said = {d.task: d for d in decided.plan.decisions}
    assert (said["alpha"].before, said["alpha"].after) == (2, 4)
    assert said["alpha"].reason.startswith("grows by 2 GPUs (+")
    assert said["alpha"].waf_after > said["alpha"].waf_before > 0
    assert said["beta"].reason == said["gamma"].reason == "unchanged"
    # The same crash, and beta finished meanwhile: the table's plan for beta's end holds beta,
    # the cluster no longer does (nor its curve); alpha is said anew, beta keeps "finished".
    done = replace(
        state,
        tasks=tuple(t for t in state.tasks if t.name != "beta"),
        assignment={n: {t: c for t, c in a.items() if t != "beta"} for n, a in crashed.items()},
        curves={k: v for k, v in state.curves.items() if k != "beta"},
    )
    allocator.happened.note(TaskDone("beta"))
    decided = decide(allocator, done, 0)
    said = {d.task: d for d in decided.plan.decisions}
    assert decided.source == "table" and decided.event == TaskDone("beta")
    assert said["alpha"].reason.startswith("grows by 2 GPUs") and said["beta"].reason.startswith("finished")
    settle(allocator, state)
    alpha_node = next(n for n, a in state.assignment.items() if "alpha" in a)
    relaunching = after_loss(state, alpha_node)  # alpha stopped whole to relaunch: none left
    relaunching = replace(
        relaunching,
        assignment={
            n: {t: c for t, c in a.items() if t != "alpha"} for n, a in relaunching.assignment.items()
        },
    )
    allocator.happened.note(NodeLost(alpha_node))
    decided = decide(allocator, relaunching, 0)
    hit = next(d for d in decided.plan.decisions if d.task == "alpha")
    assert decided.source == "table" and hit.hit and hit.reason.startswith("lost 2 GPUs with the node")


def test_a_live_event_names_the_node_not_the_planners_id() -> None:
    # The planner numbers nodes by registration order: node 3 may be any host.
    names = {0: "gpu-b", 3: "gpu-a"}
    assert named(NodeLost(3), names) == "node-lost:gpu-a"
    assert named(NodeBack(0), names) == "node-back:gpu-b"
    assert named(NodeBack(), names) == "node-back"
    assert named(NodeLost(7), names) == "node-lost:7"  # no such node: the id, not a guess
    assert named(TaskDone("beta"), names) == "task-done:beta"


def test_node_back_and_task_done_are_answered_from_the_table(allocator: Allocator) -> None:
    state = demo_state()
    lost = after_loss(state, 3)
    settle(allocator, lost)
    shrunk = allocator.table
    assert shrunk is not None
    expected = shrunk.state
    back = replace(expected, healthy=(*expected.healthy, 3))
    allocator.happened.note(NodeBack(3))
    decided = decide(allocator, back, 0)
    assert decided.source == "table" and decided.event == NodeBack(3)
    assert decided.plan.allocation() == {"alpha": 4, "beta": 2, "gamma": 2}
    done = replace(
        expected,
        tasks=tuple(t for t in expected.tasks if t.name != "beta"),
        assignment={n: {t: c for t, c in a.items() if t != "beta"} for n, a in expected.assignment.items()},
        curves={k: v for k, v in expected.curves.items() if k != "beta"},
    )
    allocator.happened.note(NodeLost(3))  # (back and lost again: to the table, no change)
    allocator.happened.note(TaskDone("beta"))
    decided = decide(allocator, done, 0)
    assert decided.source == "table" and decided.event == TaskDone("beta")
    # The record names what no plan answered yet: the return was answered above, the loss not.
    assert decided.events == (NodeLost(3), TaskDone("beta"))


def test_what_the_table_does_not_hold_is_solved_and_says_why(allocator: Allocator) -> None:
    state = demo_state()
    assert decide(allocator, state, 0).why == "no plan table yet"
    settle(allocator, state)
    newcomer = TaskSpec(name="delta", weight=5, throughput={2: 2.0e9})
    arrived = replace(
        state,
        tasks=(*state.tasks, newcomer),
        curves={**state.curves, "delta": curve_for(newcomer, state.gpu, 2)},
    )
    decided = decide(allocator, arrived, 0)  # a task the actuator never told of
    assert decided.source == "solved" and "tasks changed beyond no event" in decided.why
    assert decided.plan.allocation()["delta"] == 2
    allocator.happened.note(TasksArrived(("delta",)))  # told, but not queued when the table was built
    decided = decide(allocator, arrived, 0)
    assert decided.source == "solved" and "no queued submission of delta" in decided.why
    shrunk = {n: dict(a) for n, a in state.assignment.items()}
    node = next(n for n, a in shrunk.items() if "alpha" in a)
    shrunk[node]["alpha"] -= 1  # a failure took one of alpha's workers
    allocator.happened.note(TaskDone("delta"))  # (delta cancelled before any plan: no event)
    decided = decide(allocator, replace(state, assignment=shrunk), 0)  # no cluster event: the table's plan
    assert (decided.source, decided.event, decided.events) == ("table", None, (TaskDone("delta"),))
    assert "laid out anew" in decided.why and decided.plan.allocation() == plan(state).allocation()
    decided = decide(allocator, state, 1)
    assert decided.source == "solved" and "measurements changed" in decided.why
    assert decided.rebalance  # only the curves changed: the coordinator asks for a clear gain
    assert not decide(allocator, arrived, 1).rebalance
    allocator.happened.note(NodeLost(0))
    allocator.happened.note(NodeLost(1))
    decided = decide(allocator, after_loss(after_loss(state, 0), 1), 0)
    assert decided.source == "solved" and decided.why == "2 events at once: node-lost:0, node-lost:1"
    assert decided.events == (NodeLost(0), NodeLost(1))


def test_a_resubmitted_name_is_not_answered_by_the_table_of_its_previous_run(allocator: Allocator) -> None:
    """beta ended and a new beta was submitted before any plan: the same names, but two events
    (the state alone cannot tell them; the table's beta is the old one)."""
    state = demo_state()
    settle(allocator, state)
    allocator.happened.note(TaskDone("beta"))
    allocator.happened.note(TasksArrived(("beta",)))
    decided = decide(allocator, state, 0)
    assert decided.source == "solved" and decided.why.startswith("2 events at once")


def test_a_plan_names_each_event_once_whichever_table_answers_it(allocator: Allocator) -> None:
    """The events a plan answered are not named again while the next table is being built, and
    events a table's state already held (a rebuild for new measurements, before any plan) are
    named by the plan that table answers, though its lookup is its own plan."""
    state = demo_state()
    settle(allocator, state)
    allocator.happened.note(NodeLost(0))
    first = decide(allocator, after_loss(state, 0), 0)
    assert (first.source, first.events) == ("table", (NodeLost(0),))
    gate = threading.Event()
    allocator._builder = lambda s: (gate.wait(10), build(s))[1]
    allocator.refresh(after_loss(state, 0), first, 0)  # the next table, held back
    again = decide(allocator, after_loss(state, 0), 0)
    assert again.events == () and "being built" in again.why
    allocator.happened.note(NodeLost(1))
    both = after_loss(after_loss(state, 0), 1)
    assert decide(allocator, both, 0).events == (NodeLost(1),)
    gate.set()
    allocator.wait()
    # New measurements while node 2's loss waits for its plan: the table built for them holds it.
    allocator._builder = build
    allocator.happened.note(NodeLost(2))
    three = after_loss(both, 2)
    allocator.rebuild(three, 1)
    allocator.wait()
    decided = decide(allocator, three, 1)
    assert (decided.source, decided.event, decided.events) == ("table", None, (NodeLost(2),))


def test_a_node_lost_while_the_next_table_is_built_is_answered_by_the_one_before(
    allocator: Allocator,
) -> None:
    """A recovery re-formed alpha on fewer workers (no cluster event), its plan was decided and
    the next table is being built for the state it leads to: a node lost meanwhile is answered
    by the table before (the same cluster: its plan for the loss, laid over the workers as they
    are), not solved (in a burst of crashes a table is nearly always being built)."""
    state = demo_state()
    settle(allocator, state)
    alpha_node = next(n for n, a in state.assignment.items() if "alpha" in a)
    shrunk = replace(
        state,
        assignment={
            n: {t: c - (t == "alpha" and n == alpha_node) for t, c in a.items()}
            for n, a in state.assignment.items()
        },
    )
    planned = decide(allocator, shrunk, 0)
    assert planned.source == "table" and planned.event is None
    gate = threading.Event()
    allocator._builder = lambda s: (gate.wait(10), build(s))[1]
    # The next table, held back: of the state the plan leads to (here alpha left as it is).
    allocator.refresh(shrunk, replace(planned, layout=shrunk.assignment), 0)
    assert allocator.in_background()
    lost = next(n for n, a in state.assignment.items() if "gamma" in a)
    allocator.happened.note(NodeLost(lost))
    decided = decide(allocator, after_loss(shrunk, lost), 0)
    assert (decided.source, decided.event, decided.events) == ("table", NodeLost(lost), (NodeLost(lost),))
    assert "the table before the one being built" in decided.why
    assert decided.plan.allocation() == plan(state, NodeLost(lost)).allocation()
    gate.set()


def test_a_name_submitted_again_while_tables_are_built_is_not_answered_by_the_table_before(
    allocator: Allocator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """delta's first run arrived (answered by the table built for its arrival) and was cancelled;
    submitted again with another spec while the next tables are being built, it is another task:
    the table before, which knows it by name only, does not answer its arrival (the review found
    run 1's plan given to run 2)."""
    from unicron.control.place import allocator as module
    from unicron.planning.plantable import build_arrivals

    state = demo_state()
    settle(allocator, state)

    def states(spec: TaskSpec) -> tuple[ClusterState, ClusterState]:
        curves = {**state.curves, "delta": curve_for(spec, state.gpu, 2)}
        queued = replace(state, arriving=((spec,),), curves=curves)
        return queued, replace(state, tasks=(*state.tasks, spec), curves=curves)

    queued, arrived = states(TaskSpec(name="delta", weight=5, throughput={2: 2.0e9}))
    allocator.rebuild(queued, 0)
    allocator.happened.note(TasksArrived(("delta",)))
    allocator.wait()
    first = decide(allocator, arrived, 0)
    gate = threading.Event()
    allocator._builder = lambda s: (gate.wait(10), build(s))[1]
    monkeypatch.setattr(module, "build_arrivals", lambda s: (gate.wait(10), build_arrivals(s))[1])
    allocator.refresh(arrived, first, 0)  # the next full table, held back
    allocator.happened.note(TaskDone("delta"))  # run 1 cancelled
    again = TaskSpec(name="delta", weight=5, throughput={4: 8.0e9}, min_workers=4)
    queued, arrived = states(again)
    allocator.rebuild(replace(queued, assignment=state.assignment), 0)  # its arrival's table, held back
    allocator.happened.note(TasksArrived(("delta",)))
    assert allocator.decide(arrived, 0) is None  # solved, not looked up
    gate.set()
    decided = decide(allocator, arrived, 0)
    assert decided.plan.allocation() == plan(queued, TasksArrived(("delta",))).allocation()
    assert decided.plan.allocation()["delta"] == 4


def test_a_table_that_failed_to_build_is_built_again(allocator: Allocator) -> None:
    state = demo_state()

    def broken(s: ClusterState) -> PlanTable:
        raise RuntimeError("out of memory")

    allocator._builder = broken
    allocator.refresh(state, decide(allocator, state, 0), 0)
    with pytest.raises(RuntimeError, match="out of memory"):
        allocator.wait()
    decided = decide(allocator, state, 0)
    assert decided.source == "solved" and "could not be built: out of memory" in decided.why
    allocator._builder = build
    allocator.refresh(state, decided, 0)  # the same state as the build that failed
    allocator.wait()
    assert decide(allocator, state, 0).source == "table"


def test_a_table_whose_answer_fails_is_solved_around_and_says_why(
    allocator: Allocator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fault in the table's answer (a defect: a plan naming a task the state no longer has)
    does not leave the event unplanned: the plan is solved, and the plan says why."""
    state = demo_state()
    settle(allocator, state)

    def broken(table: PlanTable, event: object) -> object:
        raise KeyError("out")

    monkeypatch.setattr(PlanTable, "lookup", broken)
    gamma_node = next(n for n, a in state.assignment.items() if "gamma" in a)
    allocator.happened.note(NodeLost(gamma_node))
    decided = decide(allocator, after_loss(state, gamma_node), 0)
    assert decided.source == "solved" and decided.events == (NodeLost(gamma_node),)
    assert decided.why == "the table's answer failed: KeyError('out')"
    assert decided.plan.allocation() == plan(state, NodeLost(gamma_node)).allocation()


def two_lost_with_solves_held(
    allocator: Allocator,
) -> tuple[ClusterState, threading.Event, list[tuple[int, ...]]]:
    """The demo's cluster with nodes 0 and 1 lost at once since its table (no entry for two
    events), the allocator's solves held back until the event returned is set; the nodes each
    solve was asked for."""
    settle(allocator, state := demo_state())
    gate, asked = threading.Event(), list[tuple[int, ...]]()

    def held(s: ClusterState) -> Plan:
        asked.append(s.healthy)
        gate.wait(10)
        return plan(s)

    allocator._solve = held
    allocator.happened.note(NodeLost(0))
    allocator.happened.note(NodeLost(1))
    return after_loss(after_loss(state, 0), 1), gate, asked


def test_a_solve_runs_off_the_loop_and_its_plan_is_laid_over_the_workers_as_they_are(
    allocator: Allocator,
) -> None:
    """Two nodes lost at once (no table entry): the coordinator is told "not yet" at once, the
    plan is solved on the planner's own thread, the allocator's poll says once that it is done,
    and the plan is laid over the workers as a recovery left them meanwhile (no cluster event)."""
    both, gate, asked = two_lost_with_solves_held(allocator)
    assert allocator.decide(both, 0) is None and allocator.in_background() and not allocator.poll()
    moved = {n: dict(a) for n, a in both.assignment.items()}
    node, name = next((n, t) for n, a in moved.items() for t, c in a.items() if c)
    moved[node][name] -= 1  # a worker failed meanwhile: its survivors re-formed in place
    now = replace(both, assignment=moved)
    assert allocator.decide(now, 0) is None  # the same cluster: the solve under way goes on
    gate.set()
    assert allocator.solving is not None
    allocator.solving.future.result(10)
    assert allocator.poll() and not allocator.poll()  # once: the coordinator plans now
    decided = allocator.decide(now, 0)
    assert decided is not None and asked == [both.healthy]
    assert (decided.source, decided.events) == ("solved", (NodeLost(0), NodeLost(1)))
    assert decided.why.startswith("2 events at once") and decided.waited_s >= decided.seconds > 0
    assert decided.plan.allocation() == plan(both).allocation()
    assert decided.layout == laid_out(decided.plan, now)


def test_a_solved_plan_is_laid_out_beside_its_solve_unless_the_workers_moved_meanwhile(
    allocator: Allocator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The layout of a solved plan is made on the planner's thread with the solve (at 2,048 nodes
    a layout is milliseconds of the loop): used as made where the workers are where they were
    when it was asked for, made again on the loop where a recovery moved them since."""
    threads: list[str] = []

    def watched(chosen: Plan, state: ClusterState) -> dict[int, dict[str, int]]:
        threads.append(threading.current_thread().name)
        return laid_out(chosen, state)

    monkeypatch.setattr(allocator_module, "laid_out", watched)
    both, gate, _ = two_lost_with_solves_held(allocator)
    threads.clear()  # (the first plan's, before the table)
    gate.set()
    decided = decide(allocator, both, 0)
    assert decided.layout == laid_out(decided.plan, both)
    assert len(threads) == 1 and threads[0].startswith("plan-solve")
    allocator.happened.note(NodeLost(2))
    three = after_loss(both, 2)
    assert allocator.decide(three, 0) is None
    allocator.wait()
    moved = {n: dict(a) for n, a in three.assignment.items()}
    node, name = next((n, t) for n, a in moved.items() for t, c in a.items() if c)
    moved[node][name] -= 1  # a worker failed meanwhile: its survivors re-formed in place
    now = replace(three, assignment=moved)
    decided = allocator.decide(now, 0)
    assert decided is not None and decided.layout == laid_out(decided.plan, now)
    assert threads[1].startswith("plan-solve") and threads[2] == threading.current_thread().name


def test_a_solved_plan_that_could_not_be_laid_out_beside_its_solve_is_laid_out_on_the_loop(
    allocator: Allocator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A layout that fails beside the solve is not taken for the planner's fault (solved again):
    the plan is laid out on the loop, where any plan's layout raises what it raises."""
    solves: list[str] = []

    def fails_off_the_loop(chosen: Plan, state: ClusterState) -> dict[int, dict[str, int]]:
        if threading.current_thread() is not threading.main_thread():
            raise ValueError("cannot place")
        return laid_out(chosen, state)

    both, gate, _ = two_lost_with_solves_held(allocator)
    held = allocator._solve
    allocator._solve = lambda s: (solves.append(threading.current_thread().name), held(s))[1]
    monkeypatch.setattr(allocator_module, "laid_out", fails_off_the_loop)
    gate.set()
    decided = decide(allocator, both, 0)
    assert decided.layout == laid_out(decided.plan, both) and len(solves) == 1


def test_workers_are_compared_as_counts_on_nodes_less_what_an_event_took() -> None:
    """What the allocator reads to tell whether a recovery moved workers: rows and counts of
    none are none, a lost node's row and a finished task's counts are taken away first."""
    before = {0: {"a": 2}, 1: {"a": 1, "b": 1}, 2: {"b": 2}}
    assert same_workers({0: {"a": 2, "c": 0}, 1: {"b": 1, "a": 1}, 2: {"b": 2}, 3: {}}, before)
    assert not same_workers({0: {"a": 2}, 1: {"a": 1, "b": 1}, 2: {"b": 1}}, before)
    assert same_workers({0: {"a": 2}, 1: {"a": 1, "b": 1}}, before, lost=2)
    assert not same_workers({0: {"a": 2}, 1: {"a": 1, "b": 1}}, before)
    assert same_workers({0: {"a": 2}, 1: {"a": 1}}, before, done="b")
    assert not same_workers({0: {"a": 2}, 1: {"a": 1}, 2: {"b": 2}}, before, done="b")


def test_a_solve_for_a_cluster_gone_by_is_solved_again_for_the_cluster_as_it_is(allocator: Allocator) -> None:
    """A node lost while the plan for two others is solved: solved again for the three, said as
    first asked (its why, its wait from then) and started again once."""
    both, gate, asked = two_lost_with_solves_held(allocator)
    assert allocator.decide(both, 0) is None
    allocator.happened.note(NodeLost(2))
    three = after_loss(both, 2)
    assert allocator.decide(three, 0) is None
    gate.set()
    decided = decide(allocator, three, 0)
    assert asked in ([three.healthy], [both.healthy, three.healthy])  # (the first, if it had begun)
    assert decided.events == (NodeLost(0), NodeLost(1), NodeLost(2)) and decided.restarts == 1
    assert decided.why.startswith("2 events at once") and decided.waited_s > 0
    assert decided.plan.allocation() == plan(three).allocation()


def test_a_task_submitted_again_under_its_name_while_solving_is_solved_for_its_new_spec(
    allocator: Allocator,
) -> None:
    both, gate, _ = two_lost_with_solves_held(allocator)
    gate.set()
    assert allocator.decide(both, 0) is None
    other = tuple(t.model_copy(update={"weight": 9.0}) if t.name == "gamma" else t for t in both.tasks)
    again = replace(both, tasks=other)  # gamma ended and came back, heavier, before the plan
    assert allocator.decide(again, 0) is None  # (not the plan of the gamma gone by)
    decided = decide(allocator, again, 0)
    assert decided.restarts == 1 and decided.plan.allocation() == plan(again).allocation()


def test_a_cluster_that_keeps_changing_gets_its_plan_solved_on_the_loop_after_a_few_solves(
    allocator: Allocator,
) -> None:
    state, gate, _ = two_lost_with_solves_held(allocator)
    gate.set()
    for weight in range(4, 4 + MAX_RESTARTS):  # each change comes before the previous solve is used
        assert allocator.decide(state, 0) is None
        heavier = tuple(
            t.model_copy(update={"weight": float(weight)}) if t.name == "gamma" else t for t in state.tasks
        )
        state = replace(state, tasks=heavier)  # (gamma ended and was submitted again, heavier)
    decided = allocator.decide(state, 0)  # the last change: solved here
    assert decided is not None and decided.source == "solved" and decided.restarts == MAX_RESTARTS
    assert decided.why.endswith(f"the cluster changed during {MAX_RESTARTS} solves: solved on the loop")
    assert decided.plan.allocation() == plan(state).allocation() and allocator.solving is None


def test_a_burst_is_named_in_short_and_solved() -> None:
    state = demo_state()
    allocator = Allocator()
    try:
        settle(allocator, state)
        for node in range(2_000):  # (far more than a cluster has: the record stays short)
            allocator.happened.note(NodeLost(node))
        decided = decide(allocator, after_loss(after_loss(state, 0), 1), 0)
        assert decided.source == "solved" and len(decided.events) == 2_000
        assert decided.why.endswith("and 1994 more"), decided.why
    finally:
        allocator.close()


def test_the_events_told_are_what_changed() -> None:
    """Lost and back (either way round) before a plan is no change; a submission whose tasks all
    ended before it was planned is none either; a node is in service only while healthy."""
    assert net([NodeLost(1), NodeBack(1), TaskDone("a")]) == (TaskDone("a"),)
    assert net([NodeBack(4), NodeLost(4)]) == ()
    assert net([NodeLost(1), NodeLost(1)]) == (NodeLost(1),)
    assert net([TasksArrived(("a", "b")), TaskDone("a"), TaskDone("b")]) == ()
    arrived_one_ended = net([TasksArrived(("a", "b")), TaskDone("a")])
    assert arrived_one_ended == (TasksArrived(("a", "b")), TaskDone("a"))
    # The name's old run ended, a new one came and went: its old run's end is what changed.
    assert net([TaskDone("a"), TasksArrived(("a",)), TaskDone("a")]) == (TaskDone("a"),)
    # A submission told again with the next one queued beside it: the later arrival stands.
    assert net([TasksArrived(("x",)), TasksArrived(("x", "y"))]) == (TasksArrived(("x", "y")),)
    assert net([TasksArrived(("x",)), TasksArrived(("x", "y")), TaskDone("x"), TaskDone("y")]) == ()
    log = Happened()
    log.node_moved(3, NodeState.HEALTHY, NodeState.DRAINING)
    log.node_moved(3, NodeState.DRAINING, NodeState.LOST)  # out of service already: nothing
    log.node_moved(5, None, NodeState.HEALTHY)  # a new node
    log.node_moved(6, None, NodeState.ISOLATED)  # registered while its isolation runs: not in service
    log.node_moved(7, NodeState.ISOLATED, NodeState.HEALTHY)
    assert log.since(0) == (NodeLost(3, drained=True), NodeBack(5), NodeBack(7))
    assert log.since(2) == (NodeBack(7),) and log.last == 3


def with_delta(state: ClusterState) -> tuple[ClusterState, ClusterState]:
    """``state`` with a submission of delta queued (what the table is built for), and the
    cluster once delta is among its tasks (what the next reconcile sees)."""
    delta = TaskSpec(name="delta", weight=5, throughput={2: 2.0e9})
    curves = {**state.curves, "delta": curve_for(delta, state.gpu, 2)}
    queued = replace(state, arriving=((delta,),), curves=curves)
    return queued, replace(state, tasks=(*state.tasks, delta), curves=curves)


def test_a_queued_submission_is_answered_from_the_table_built_for_it(allocator: Allocator) -> None:
    state = demo_state()
    settle(allocator, state)
    queued, arrived = with_delta(state)
    allocator.rebuild(queued, 0)
    allocator.happened.note(TasksArrived(("delta",)))  # (as the placer notes it: after the rebuild)
    allocator.wait()
    assert allocator.poll() and not allocator.poll()  # once: the coordinator plans now
    decided = decide(allocator, arrived, 0)
    assert decided.source == "table" and decided.event == TasksArrived(("delta",))
    # The heaviest task per slot takes two slots: gamma (weight 1) gives way.
    assert decided.plan.allocation() == plan(queued, TasksArrived(("delta",))).allocation()
    assert decided.plan.allocation() == {"alpha": 4, "beta": 2, "gamma": 0, "delta": 2}
    # The submission waited for its arrival's plan only, not a full table: another event is solved.
    table = allocator.table
    assert table is not None and table.node_back is None and not table.node_lost
    allocator.happened.note(NodeLost(0))
    assert decide(allocator, after_loss(arrived, 0), 0).source == "solved"
    # delta cancelled before it was planned, then a node lost: not in this table, solved.
    allocator.happened.note(TaskDone("delta"))
    decided = decide(allocator, after_loss(state, 0), 0)
    assert decided.source == "solved" and "arrival only" in decided.why, decided.why
    # The full table of the state the arrival's plan leads to no longer holds the arrival.
    allocator.refresh(arrived, decided, 0)
    allocator.wait()
    assert allocator.table is not None and not allocator.table.task_arrived
    assert len(allocator.table.node_lost) == len(state.healthy)


def test_while_new_measurements_are_built_in_the_previous_table_answers(allocator: Allocator) -> None:
    state = demo_state()
    settle(allocator, state)
    gate = threading.Event()
    allocator._builder = lambda s: (gate.wait(10), build(s))[1]
    allocator.rebuild(state, 1)  # measurements changed: version 1
    assert not allocator.poll()
    node = next(iter(state.healthy))
    allocator.happened.note(NodeLost(node))
    decided = decide(allocator, after_loss(state, node), 1)
    assert decided.source == "table" and decided.event == NodeLost(node)
    assert "previous measurements" in decided.why
    gate.set()
    allocator.wait()
    assert allocator.poll()
    allocator.happened.note(NodeBack(node))  # (back: the new table's state has it)
    decided = decide(allocator, state, 1)
    assert (decided.source, decided.why, decided.rebalance) == ("table", "", True)


def test_rate_meter_counts_complete_steps_after_warm_up() -> None:
    meter = RateMeter(window_s=1.0, skip=1, min_steps=2, change=0.2)
    got = []
    for step in range(1, 8):
        for rank in (1, 0):  # every rank reports 8 samples; rank 0 says when the step ended
            rate = meter.report("t", 1, 2, step, rank, 8, 100.0 + 0.5 * step, flops_per_sample=10.0)
            if rate is not None:
                got.append(rate)
    # 16 samples every 0.5 s = 32 samples/s = 320 FLOP/s; reported once (then within 20 %).
    assert got == [pytest.approx(320.0)]
    assert meter.measured("t") == {2: pytest.approx(320.0)} and meter.version == 1
    # A new generation starts a new series (its first steps pay for joining).
    assert meter.report("t", 2, 1, 9, 0, 8, 200.0, flops_per_sample=10.0) is None


def test_the_planner_inputs_come_from_the_cluster_spec(tmp_path: Path) -> None:
    """The coordinator plans with the GPU, MTBF and transition settings of --cluster, and counts a
    ``model:`` task's work with the model's FLOPs per sample."""
    hardware = LiveClusterSpec(gpu="A100", node_mtbf_hours=500, planner={"transition": {"reconfigure_s": 7}})
    settings = CoordinatorSettings(state_dir=tmp_path, checkpoint_root=tmp_path / "ckpt", cluster=hardware)
    clock = [1000.0]
    c = Coordinator(settings, lambda: clock[0])
    try:
        c.register(Registration(node="n0", slots=2))
        model = (
            "{layers: 2, hidden_size: 64, heads: 4, sequence_length: 32, vocabulary: 64, global_batch: 16}"
        )
        (spec,) = parse_live_tasks(
            f"name: lm\nweight: 2\nmodel: {model}\nrun: {{program: [x], iterations: 9}}"
        )
        c.submit(spec)
        state, _ = c.placer.cluster_state(c.store.snapshot())
        assert state.gpu.peak_flops == lookup_gpu("A100").peak_flops  # type: ignore[union-attr]
        assert (state.node_mtbf_hours, state.settings.transition.reconfigure_s) == (500, 7)
        c.placer.allocator.wait()
        c.tick()
        (task,) = c.store.tasks(live_only=True)
        assert spec.model is not None and task.workers == 2
        report = IterationReport(
            task="lm", generation=1, rank=0, step=1, duration_s=0.1, samples=8, time=1000.0
        )
        c.heartbeat(Heartbeat(node="n0", reports=[report]))
        assert c.store.get_task("lm").flop == pytest.approx(2 * 8 * flops_per_sample(spec.model))
    finally:
        c.shutdown()

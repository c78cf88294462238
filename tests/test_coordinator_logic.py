"""The coordinator's logic stepped by hand: a fake clock, agents played by the test, no worker
processes. Each test drives one path of detection and handling and asserts what the coordinator
ordered (launches, stops, renames), the generations and the incident it recorded.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from unicron.control.recover.attribution import Sign, attribute
from unicron.core.classify import classify
from unicron.core.protocol import (
    DoneReport,
    DumpStacks,
    ExceptionReport,
    ExitReport,
    ForgetTask,
    Heartbeat,
    IterationReport,
    LaunchFailedReport,
    LaunchWorker,
    Phase,
    Progress,
    RenameWorkers,
    StopWorkers,
    WorkerState,
    ready_key,
)
from unicron.core.settings import Settings
from unicron.core.specs import ModelSpec
from unicron.core.states import IllegalTransition, NodeState, TaskState
from unicron.core.taxonomy import ErrorKind, Scope
from unicron.planning.gpt import flops_per_sample


def test_a_dead_worker_is_measured_from_its_exit_and_survivors_go_on_in_place(make: Any) -> None:
    cluster = make()
    cluster.clock.now += 0.2
    died = cluster.clock.now
    cluster.clock.now += 0.05  # the agent's report reaches the coordinator 50 ms later
    cluster.exit(1, code=None, signal=9, at=died)
    (incident,) = cluster.events("incident")
    assert incident["kind"] == "exited_abnormally" and incident["detection_s"] == pytest.approx(0.05)
    task = cluster.c.store.get_task("lm")
    assert task.generation == 2 and task.workers == 3 and task.state is TaskState.STARTING
    # One rename order per node, naming its survivors (old rank -> new rank).
    renames = [(node, o.ranks) for node, o in cluster.orders if isinstance(o, RenameWorkers)]
    assert sorted(renames) == [("n0", {0: 0}), ("n1", {2: 1, 3: 2})], renames
    # Nothing was launched or stopped besides the dead rank: the survivors go on.
    assert len([o for _, o in cluster.orders if isinstance(o, LaunchWorker)]) == 4
    cluster.train(2)
    (outcome,) = cluster.events("outcome")
    assert outcome["outcome"] == "recovered"


def test_a_tasks_preload_goes_with_every_worker_it_starts(make: Any) -> None:
    """run.preload reaches each worker's agent in the worker contract (UNICRON_PRELOAD, which
    picks its fork server: ``control/agent/warmstart.py``): at launch and when the task grows."""
    cluster = make(run_extra=", preload: [transformers, torch.distributed.fsdp]")
    growth = cluster.grow_under_way(2)
    launched = [o for _, o in cluster.launched()]
    assert len(launched) == 4 + len(growth.newcomers)
    assert {o.env.get("UNICRON_PRELOAD") for o in launched} == {"transformers,torch.distributed.fsdp"}
    assert all("UNICRON_PRELOAD" not in o.env for _, o in make().launched())  # (none named: none set)


def test_a_step_finished_before_the_move_in_place_counts(make: Any) -> None:
    """A survivor's report of a step it finished in the old generation arrives after the
    coordinator moved it: the step was kept, so its samples count (once)."""
    cluster = make()
    cluster.exit(1)
    before = cluster.c.store.get_task("lm").samples
    node, _ = cluster.running[("lm", 2, 0)]
    late = IterationReport(task="lm", generation=1, rank=0, step=2, duration_s=0.1, samples=4)
    cluster.beat(node, late, late)
    assert cluster.c.store.get_task("lm").samples == before + 4
    gone = IterationReport(task="lm", generation=1, rank=1, step=2, duration_s=0.1, samples=4)
    cluster.beat(node, gone)  # the dead rank's: not moved, its step was redone by the others
    assert cluster.c.store.get_task("lm").samples == before + 4


def test_an_exit_while_being_renamed_belongs_to_the_new_generation(make: Any) -> None:
    """A second failure during recovery: a survivor dies before its agent renamed it. Its exit,
    reported under the old generation, must still open the new generation's incident (else the
    task waits for a dead member forever)."""
    cluster = make(task_fault_window_s=0.5)  # the two deaths are 1 s apart: independent
    task = cluster.c.store.get_task("lm")
    node, _ = cluster.running[("lm", 1, 2)]
    cluster.exit(1)
    assert cluster.c.store.get_task("lm").generation == 2
    cluster.clock.now += 1.0
    late = ExitReport(task="lm", generation=1, rank=2, node=node, code=1, signal=None, time=cluster.clock.now)
    cluster.running.pop(("lm", 2, 1), None)
    cluster.beat(node, late)
    incidents = cluster.events("incident")
    assert [i["generation"] for i in incidents] == [task.generation, 2]
    # Generation 2 re-formed in place from running members: its failure is a worker's, not a
    # start-up failure of the task (that rule is for generations launched afresh).
    assert incidents[1]["scope"] == "worker"
    assert cluster.c.store.get_task("lm").generation == 3  # the two left form generation 3
    # The first incident's recovery never finished: the second took it over, and says so.
    (superseded,) = cluster.events("outcome")
    assert superseded["outcome"] == "superseded" and superseded["incident"] == incidents[0]["id"]
    assert superseded["by"] == incidents[1]["id"]


def test_an_in_process_recovery_past_its_deadline_escalates_to_a_restart(make: Any) -> None:
    """Tier one (the survivors rebuild in place) regains no step by the deadline: the stuck
    generation is stopped and the task restarts from its checkpoint; the incident records both
    actions and the escalation. Before the deadline nothing happens."""
    cluster = make(recovery_deadline_s=10.0)
    cluster.exit(1)
    assert cluster.c.store.get_task("lm").generation == 2
    for _ in range(19):
        cluster.step(0.5)  # 9.5 s: not yet
    assert cluster.events("escalation") == []
    assert not [o for _, o in cluster.orders if isinstance(o, StopWorkers) and o.rank is None]
    cluster.step(1.0)
    failed, passed = cluster.events("escalation")
    (incident,) = cluster.events("incident")
    assert incident["action"] == "restart failed processes"  # rank 1 stopped, the others went on
    # The tier failed (no step by the deadline); reconfiguring cannot leave out members stuck
    # on the way, as none arrived: the task restarts from its checkpoint, and the log says so.
    assert (failed["from_action"], failed["to_action"], failed["carried"]) == (
        "restart failed processes",
        "reconfigure",
        False,
    )
    assert failed["why"] == "no step within 10 s" and failed["incident"] == incident["id"]
    assert (passed["to_action"], passed["carried"]) == ("restart from checkpoint", True)
    assert passed["why"] == "no member reached generation 2: none to leave out"
    stops = [o for _, o in cluster.orders if isinstance(o, StopWorkers) and o.rank is None]
    assert {o.generation for o in stops} == {2}  # the stuck generation, on every node
    assert cluster.c.store.get_task("lm").state is TaskState.RESTARTING
    cluster.running.clear()  # the agents stopped them
    for _ in range(30):
        cluster.step(0.5)
    task = cluster.c.store.get_task("lm")
    launched = [
        o for _, o in cluster.orders if isinstance(o, LaunchWorker) and o.generation == task.generation
    ]
    assert task.generation > 2 and len(launched) == 4  # every rank relaunched
    cluster.train(task.step + 1)
    (outcome,) = cluster.events("outcome")
    assert outcome["outcome"] == "recovered"
    assert outcome["actions"] == ["restart failed processes", "restart from checkpoint"]


def test_a_recovery_past_its_deadline_restarts_only_members_stuck_on_the_way(make: Any) -> None:
    """Whether a member reached the re-formed generation is told by where its process is, also
    while its agent still reports it under its old identity (the rename not carried out yet):
    only the one still in the old generation is named stuck and restarted."""
    cluster = make(recovery_deadline_s=10.0)
    cluster.late_renames.add("n1")
    cluster.exit(1)  # on n0: ranks 2 and 3 on n1 become ranks 1 and 2
    assert cluster.c.store.get_task("lm").generation == 2
    arrived = Progress(pid=1, generation=2, step=2, phase=Phase.REJOIN)
    cluster.positions |= {("lm", 2, 0): arrived, ("lm", 1, 2): arrived}
    cluster.positions[("lm", 1, 3)] = Progress(pid=1, generation=1, step=2, phase=Phase.COLLECTIVE)
    for _ in range(21):
        cluster.step(0.5)
    (escalation,) = cluster.events("escalation")
    assert "rank(s) [2] never reached generation 2" in escalation["why"], escalation
    # Where the stuck member is held is asked for on every node of the generation, before the
    # stop that follows (an agent carries its orders out in turn).
    dumps = [
        (n, i) for i, (n, o) in enumerate(cluster.orders) if isinstance(o, DumpStacks) and o.generation == 2
    ]
    stops = [
        (n, i) for i, (n, o) in enumerate(cluster.orders) if isinstance(o, StopWorkers) and o.generation == 2
    ]
    assert {n for n, _ in dumps} == {"n0", "n1"} and stops, cluster.orders
    assert all(min(i for m, i in dumps if m == n) < i for n, i in stops)


def test_a_member_the_agent_lists_as_exited_is_not_waited_for(make: Any) -> None:
    """The exit report went under an identity the worker has left; the agent's list of its
    workers (renamed, not running, killed by signal 9) is enough to open the incident."""
    cluster = make()
    cluster.exit(1)
    node, pid = cluster.running.pop(("lm", 2, 1))
    dead = WorkerState(task="lm", generation=2, rank=1, pid=pid, running=False, returncode=-9)
    cluster.c.heartbeat(Heartbeat(node=node, workers=[dead]))
    # It died before the re-formed generation trained (the same event as the first death):
    # the incident widens to it, and the survivors re-form without it.
    (incident,) = cluster.events("incident")
    (widened,) = cluster.events("incident_widened")
    assert widened["incident"] == incident["id"] and "signal 9" in widened["why"]
    assert cluster.c.store.get_task("lm").workers == 2
    assert cluster.c.store.get_task("lm").generation == 3


def test_an_exit_whose_report_still_waits_behind_earlier_reports_is_heard_in_order(make: Any) -> None:
    """A coordinator back after a restart hears a node's registration, listing the workers as they
    are now, before the backlog of reports they sent meanwhile: a rank that finished its steps and
    exited cleanly while the coordinator was away is listed exited, its exit report still waiting
    behind its steps. Taken from the list, the exit came before the steps: "exited before the last
    step", an incident and a recovery of a task that had finished (seen in a live run)."""
    cluster = make()
    node, pid = cluster.running.pop(("lm", 1, 3))
    finished = {"running": False, "returncode": 0, "exit_unsent": True}
    done = WorkerState(task="lm", generation=1, rank=3, pid=pid, **finished)
    others = [
        WorkerState(task=t, generation=g, rank=r, pid=p, running=True)
        for (t, g, r), (n, p) in cluster.running.items()
        if n == node
    ]
    cluster.c.heartbeat(Heartbeat(node=node, workers=[*others, done]))
    cluster.clock.now += 0.5
    cluster.c.tick()
    assert cluster.events("incident") == [], [e["why"] for e in cluster.events("incident")]
    assert cluster.c.store.get_task("lm").generation == 1


def test_a_clean_exit_before_the_first_step_is_not_left_starting(make: Any) -> None:
    cluster = make(recovery="restart")
    cluster.exit(0, code=0)
    assert cluster.c.store.get_task("lm").state is TaskState.RESTARTING
    (incident,) = cluster.events("incident")
    assert incident["why"].endswith("exited before the last step") and incident["scope"] == "task"


def test_a_crash_of_a_fresh_launch_before_its_first_step_is_the_tasks(make: Any) -> None:
    """A restarted generation whose one worker crashes before step 1, on one node only: the
    program's fault, not the node's (found when only the two-node rule caught such crashes)."""
    cluster = make(recovery="restart", isolate_after=2)
    cluster.exit(1)  # a running generation: a worker's fault
    assert cluster.events("incident")[0]["scope"] == "worker"
    cluster.running.clear()
    for _ in range(30):
        cluster.step(0.5)
    task = cluster.c.store.get_task("lm")
    assert task.state is TaskState.STARTING and task.launched_generation == task.generation == 2
    cluster.exit(1)
    assert cluster.events("incident")[1]["scope"] == "task"
    assert cluster.events("node_isolated") == []


def test_a_fresh_launchs_worker_killed_from_outside_is_not_the_programs_fault(make: Any) -> None:
    """SIGKILL (the OOM killer, an operator, the chaos soak) before step 1 of a relaunch: no doing
    of the program, so a worker's fault, not the task's (in the soak with the ladder's defaults,
    three such kills failed a task as "the same task fault 3 times")."""
    cluster = make(recovery="restart")
    cluster.exit(1)
    cluster.running.clear()
    for _ in range(30):
        cluster.step(0.5)
    task = cluster.c.store.get_task("lm")
    assert task.state is TaskState.STARTING and task.launched_generation == task.generation == 2
    cluster.exit(1, code=None, signal=9)
    assert cluster.events("incident")[1]["scope"] == "worker"


def test_the_same_fault_on_every_node_blames_no_node_and_fails_the_task(make: Any) -> None:
    cluster = make(recovery="restart", isolate_after=2, same_fault_limit=3)
    for attempt in range(3):
        for rank in range(4):
            if ("lm", cluster.c.store.get_task("lm").generation, rank) in cluster.running:
                cluster.exit(rank, code=1)
        for _ in range(30):
            if cluster.c.store.get_task("lm").state is not TaskState.RESTARTING:
                break
            cluster.step()
        if attempt < 2:
            assert cluster.c.store.get_task("lm").state is TaskState.STARTING, attempt
            cluster.train(1)
    task = cluster.c.store.get_task("lm")
    assert task.state is TaskState.FAILED and "restarting cannot mend it" in (task.reason or "")
    # Freed by the call that failed it, not at a later one: nothing of it is left to act on.
    assert cluster.c.act.next_ended() is None and "lm" not in cluster.c.recovery.ladder.actions
    assert all(n.state is NodeState.HEALTHY for n in cluster.c.store.nodes())
    assert cluster.events("node_isolated") == []
    assert {i["scope"] for i in cluster.events("incident")[1:]} == {"task"}
    cluster.step()  # a failed task, too, leaves nothing on its nodes
    assert {n for n, o in cluster.orders if isinstance(o, ForgetTask)} == {"n0", "n1"}
    assert cluster.c.recovery.incidents == {} and "lm" not in cluster.c.recovery.ladder.actions


def test_a_launch_failure_is_an_incident_on_the_task(make: Any) -> None:
    cluster = make(recovery="restart", same_fault_limit=1)
    task = cluster.c.store.get_task("lm")
    report = LaunchFailedReport(
        task="lm", generation=task.generation, rank=0, node="n0", error="FileNotFoundError: no-such-program"
    )
    cluster.beat("n0", report)
    task = cluster.c.store.get_task("lm")
    assert task.state is TaskState.FAILED and "no-such-program" in (task.reason or "")
    assert cluster.c.act.next_ended() is None and cluster.c.recovery.incidents == {}  # freed at once


def test_an_unknown_error_kind_is_handled_as_other(make: Any) -> None:
    cluster = make()
    node, _ = cluster.running[("lm", 1, 3)]
    report = ExceptionReport(
        task="lm", generation=1, rank=3, step=1, error_type="Weird", message="x", kind="from-the-future"
    )
    cluster.beat(node, report)
    (incident,) = cluster.events("incident")
    assert incident["kind"] == "other" and cluster.events("report_rejected") == []


def test_an_iteration_report_sent_twice_is_counted_once(make: Any) -> None:
    cluster = make()
    before = cluster.c.store.get_task("lm").samples
    node, _ = cluster.running[("lm", 1, 0)]
    again = IterationReport(task="lm", generation=1, rank=0, step=1, duration_s=0.1, samples=4)
    cluster.beat(node, again)
    assert cluster.c.store.get_task("lm").samples == before == 16


def test_a_finished_task_leaves_no_spare(make: Any) -> None:
    cluster = make(hot_spares=1)
    # The task shrinks (a worker died), so a slot is free for a spare of it.
    cluster.exit(3)
    cluster.train(2)
    for _ in range(3):
        cluster.step()
    assert cluster.c.placer.spares or cluster.c.generations.growing
    cluster.c.cancel("lm")
    cluster.step()
    assert cluster.c.placer.spares == {}
    # Every node is told to free the task's in-memory checkpoints.
    assert {n for n, o in cluster.orders if isinstance(o, ForgetTask) and o.task == "lm"} == {"n0", "n1"}


def test_a_silent_node_is_lost_after_the_deadline(make: Any) -> None:
    cluster = make(heartbeat_deadline_s=2.0)
    for _ in range(5):  # both heard past an agent's request timeout since the coordinator started
        cluster.step(0.5)
    for _ in range(3):
        cluster.clock.now += 0.5
        cluster.beat("n0")
        cluster.c.tick()
    assert cluster.c.store.node("n1").state is NodeState.HEALTHY  # type: ignore[union-attr]
    cluster.clock.now += 1.0
    cluster.beat("n0")
    cluster.c.tick()
    assert cluster.c.store.node("n1").state is NodeState.LOST  # type: ignore[union-attr]
    (incident,) = cluster.events("incident")
    assert incident["kind"] == "node_lost" and cluster.c.store.get_task("lm").workers == 2


def test_orders_are_sent_again_until_acknowledged(make: Any) -> None:
    """An answer lost on its way (the agent's long poll timed out meanwhile) loses no order."""
    cluster = make()
    cluster.c.cancel("lm")
    lost = cluster.c.orders("n0", cluster.acked["n0"])  # taken, never delivered
    assert lost.orders and all(isinstance(o, (StopWorkers, ForgetTask)) for o in lost.orders)
    again = cluster.c.orders("n0", cluster.acked["n0"])
    assert again == lost
    assert cluster.c.orders("n0", lost.numbers[-1]).orders == []  # acknowledged: done


def test_illegal_transitions_are_refused(make: Any) -> None:
    cluster = make()
    cluster.c.cancel("lm")
    with pytest.raises(IllegalTransition):
        cluster.c.act.task_running("lm", cluster.clock.now)


def test_scope_attribution() -> None:
    recent = [Sign(0.0, ErrorKind.CUDA_ERROR, "a", 1)]
    assert attribute(Sign(1.0, ErrorKind.CUDA_ERROR, "b", 1), recent, 10.0) is Scope.TASK
    assert attribute(Sign(1.0, ErrorKind.CUDA_ERROR, "b"), recent, 10.0) is Scope.TASK  # unknown: alike
    assert attribute(Sign(1.0, ErrorKind.CUDA_ERROR, "a", 1), recent, 10.0) is Scope.WORKER
    assert attribute(Sign(20.0, ErrorKind.CUDA_ERROR, "b", 1), recent, 10.0) is Scope.WORKER
    # A survivor that went on into the re-formed generation and died there: a new failure.
    assert attribute(Sign(1.0, ErrorKind.CUDA_ERROR, "b", 2), recent, 10.0) is Scope.WORKER
    assert attribute(Sign(1.0, ErrorKind.ECC_ERROR, "b", 1), recent, 10.0) is Scope.NODE
    assert attribute(Sign(1.0, ErrorKind.STORAGE_ERROR, "b"), [], 10.0) is Scope.STORAGE


def test_a_task_whose_final_state_is_saved_ends_without_waiting_for_a_latecomer(make: Any) -> None:
    """Rank 0 saved the final state and the members exit; a worker that never got to train (a
    newcomer of a grow committed as training ended, waiting for members that are gone) must not
    keep the task from finishing: it is stopped."""
    cluster = make()
    cluster.train(100)
    task = cluster.c.store.get_task("lm")
    node, _ = cluster.running[("lm", task.generation, 0)]
    cluster.beat(node, DoneReport(task="lm", generation=task.generation, rank=0, step=100, digest="d"))
    cluster.exit(0, code=0)
    task = cluster.c.store.get_task("lm")
    assert task.state is TaskState.FINISHED and task.digest == "d"
    # The whole generation is stopped on every node that still runs some of it.
    stops = [(n, o) for n, o in cluster.orders if isinstance(o, StopWorkers) and o.rank is None]
    assert {n for n, _ in stops} == {"n0", "n1"} and {o.generation for _, o in stops} == {task.generation}
    assert cluster.events("incident") == []


def test_a_failure_during_a_grow_stops_only_the_newcomers(make: Any) -> None:
    """The grow is given up; its newcomers are stopped one by one (a generation-wide stop would
    reach the members of older generations on the same node: the survivors)."""
    cluster = make(task_fault_window_s=0.1)
    growth = cluster.grow_under_way(2)
    newcomers = {k for k in cluster.running if k[1] == growth.generation}
    assert newcomers
    before = len(cluster.orders)
    task = cluster.c.store.get_task("lm")
    cluster.exit(min(r for (_, g, r) in cluster.running if g == task.generation))
    stops = [o for _, o in cluster.orders[before:] if isinstance(o, StopWorkers)]
    assert {("lm", o.generation or 0, o.rank) for o in stops} == newcomers
    assert [e["generation"] for e in cluster.events("task_grow_cancelled")] == [growth.generation]
    assert cluster.c.store.get_task("lm").workers == 2  # the two survivors go on in place


def test_a_grows_newcomer_left_without_the_members_is_relaunched_from_the_checkpoint(make: Any) -> None:
    """The grow let rank 3 in (generation 3); the members fail one by one before it trained a
    step, so it never took their state. While a member survives it takes the state from it; when
    none does the task restarts from its checkpoint, recorded so, not as an in-place recovery of
    a newcomer that would train on from its checkpoint with nothing recorded lost."""
    cluster = make()
    growth = cluster.regrow(2)
    store = cluster.c.store
    joining = [w.rank for w in store.workers("lm", growth.generation, live=True) if w.joining]
    assert joining == growth.newcomers == [3]
    for _ in range(3):
        cluster.exit(0)
        cluster.step()
    assert [e["survivors"] for e in cluster.events("in_process_recovery")][1:] == [[1, 2, 3], [1, 2]]
    assert cluster.c.store.get_task("lm").state is TaskState.RESTARTING
    assert cluster.events("response")[-1]["action"] == "restart from checkpoint"
    assert "no survivor holds the task's state" in cluster.events("escalation")[0]["why"]
    for _ in range(100):
        if store.get_task("lm").launched_generation > 1:
            break
        cluster.step()
    task = store.get_task("lm")
    launched = store.workers("lm", task.generation, live=True)
    assert task.launched_generation == task.generation and task.redo_until == 2  # steps 1-2 again
    assert len(launched) == task.workers and not any(w.joining for w in launched)


def test_a_task_that_ends_during_a_grow_stops_its_newcomers_and_frees_their_slots(make: Any) -> None:
    """The task's own stop reaches its current generation, not a grow's: its newcomers' rows held
    their slots until the launch time-out (in the soak a plan waited two minutes for one)."""
    cluster = make()
    growth = cluster.grow_under_way(2)
    newcomers = {k for k in cluster.running if k[1] == growth.generation}
    assert newcomers
    before = len(cluster.orders)
    assert cluster.c.cancel("lm")
    cluster.step()  # the agents take their orders
    stops = [o for _, o in cluster.orders[before:] if isinstance(o, StopWorkers)]
    assert newcomers <= {("lm", o.generation or 0, o.rank) for o in stops}
    assert [e["generation"] for e in cluster.events("task_grow_cancelled")] == [growth.generation]
    assert cluster.c.store.workers("lm", growth.generation, live=True) == []  # no slot held
    assert cluster.c.generations.growing == {}


def test_a_task_past_its_last_step_is_not_grown(make: Any) -> None:
    """Its members save the final state and leave: newcomers would wait for a step boundary that
    never comes (the soak's plan grew such a task every tick, and gave each grow up at once)."""
    cluster = make()
    cluster.exit(3)
    cluster.train(100)  # the last step: the survivors save and leave
    for _ in range(4):
        cluster.step()
    assert cluster.events("task_grow") == [] and cluster.c.generations.growing == {}


def test_recovery_tiers_escalate_in_turn(make: Any) -> None:
    """Restart failed (rank 1 stopped, the others re-form in place) stalls with one survivor
    stuck on its way into the re-formed group: the next tier, reconfigure, takes the stuck
    member's node out (its members leave with it) and the rest go on in place. When that stalls
    too, the task restarts from its checkpoint. Each step is recorded as carried out."""
    cluster = make(recovery_deadline_s=5.0, isolation_s=1000.0)
    cluster.exit(1)  # generation 2: old ranks 0, 2, 3 as 0, 1, 2
    for rank, at in ((0, 2), (1, 2), (2, 1)):  # new rank 2 is still in generation 1
        cluster.positions[("lm", 2, rank)] = Progress(pid=1, generation=at, step=2, phase=Phase.REJOIN)
    stuck_node = cluster.running[("lm", 2, 2)][0]
    for _ in range(11):
        cluster.step(0.5)
    (first,) = cluster.events("escalation")
    assert (first["from_action"], first["to_action"], first["carried"]) == (
        "restart failed processes",
        "reconfigure",
        True,
    )
    assert "rank(s) [2] never reached generation 2" in first["why"]
    assert cluster.c.store.node(stuck_node).state is NodeState.ISOLATED  # type: ignore[union-attr]
    task = cluster.c.store.get_task("lm")
    assert task.generation == 3 and task.workers == 1 and task.state is TaskState.STARTING
    (kept,) = cluster.c.store.workers("lm", 3, live=True)
    assert kept.node != stuck_node
    for _ in range(11):
        cluster.step(0.5)
    second = cluster.events("escalation")[1]
    assert (second["from_action"], second["to_action"]) == ("reconfigure", "restart from checkpoint")
    assert cluster.c.store.get_task("lm").state is TaskState.RESTARTING


def test_a_reconfiguration_that_regains_a_step_recovers_the_task_and_it_grows_back_off_the_node(
    make: Any,
) -> None:
    """As above, but the group re-formed by reconfigure trains: the incident is recovered by the
    two tiers carried out, nothing was relaunched, and the plan grows the task back onto the slot
    left on the healthy node with a newcomer (which takes the live member's state), never onto
    the isolated node."""
    cluster = make(recovery_deadline_s=5.0, isolation_s=1000.0, hot_spares=0)
    cluster.exit(1)  # generation 2: old ranks 0, 2, 3 as 0, 1, 2
    for rank, at in ((0, 2), (1, 2), (2, 1)):  # new rank 2 is still in generation 1
        cluster.positions[("lm", 2, rank)] = Progress(pid=1, generation=at, step=2, phase=Phase.REJOIN)
    stuck_node = cluster.running[("lm", 2, 2)][0]
    for _ in range(11):
        cluster.step(0.5)
    (escalation,) = cluster.events("escalation")
    assert (escalation["from_action"], escalation["to_action"]) == ("restart failed processes", "reconfigure")
    (isolated,) = cluster.c.store.events(kinds=["node_isolated"])
    assert isolated.node == stuck_node
    for key in [k for k, (node, _) in cluster.running.items() if node == stuck_node]:
        del cluster.running[key]  # the isolation's stop, carried out by the node's agent
    task = cluster.c.store.get_task("lm")
    assert task.generation == 3 and task.workers == 1
    cluster.train(3)
    (incident,) = cluster.events("incident")
    (outcome,) = cluster.events("outcome")
    assert (outcome["incident"], outcome["outcome"]) == (incident["id"], "recovered")
    assert outcome["actions"] == ["restart failed processes", "reconfigure"]
    growth = None
    for _ in range(6):
        cluster.step()
        growth = cluster.c.generations.growing.get("lm")
        if growth is not None:
            break
    assert growth is not None, "no grow back onto the slot left"
    newcomers = [(n, o) for n, o in cluster.launched() if o.generation == growth.generation]
    assert newcomers and all(n != stuck_node for n, _ in newcomers), newcomers
    for rank in growth.newcomers:
        cluster.c.act.rendezvous.set("lm", ready_key("lm", growth.generation, rank), "ready")
    cluster.step()
    assert cluster.c.store.get_task("lm").generation == growth.generation  # grown
    assert len(cluster.c.store.events(kinds=["task_launch"])) == 1  # never relaunched
    assert cluster.c.store.node(stuck_node).state is NodeState.ISOLATED  # type: ignore[union-attr]


def test_steps_trained_again_after_a_restart_are_not_progress(make: Any) -> None:
    """A restart from the checkpoint retrains the steps since it: they add nothing to the samples
    and FLOP achieved (the WAF), until the task passes the step it had reached."""
    cluster = make(recovery="restart")
    for step in (2, 3, 4):
        cluster.train(step)
    reached = cluster.c.store.get_task("lm")
    assert reached.step == 4 and reached.samples == 4 * 16
    cluster.exit(1)  # no checkpoint yet: the task restarts from step 0
    cluster.running.clear()
    for _ in range(30):
        cluster.step(0.5)
    task = cluster.c.store.get_task("lm")
    assert task.generation == 2 and task.redo_until == 4
    for step in (1, 2, 3, 4, 5):
        cluster.train(step)
    after = cluster.c.store.get_task("lm")
    assert after.samples == 5 * 16  # steps 1-4 again added nothing; step 5 did


def test_an_incident_open_when_its_task_ends_ends_with_it(make: Any) -> None:
    """A task cancelled (or finishing) while a failure is being recovered: the incident is closed
    with the task's end, not left open; so is one whose task ended while no coordinator ran."""
    cluster = make()
    cluster.exit(1)
    cluster.c.cancel("lm")
    (outcome,) = cluster.events("outcome")
    assert outcome["outcome"] == "task ended" and outcome["task_state"] == "cancelled"
    assert outcome["actions"] == ["restart failed processes"]

    other = make()
    other.exit(1)
    other.c.act.task_ended("lm", TaskState.CANCELLED, other.clock.now)  # behind the coordinator's back
    other.restart()
    (outcome,) = other.events("outcome")
    assert outcome["outcome"] == "task ended" and outcome["task_state"] == "cancelled"
    other.restart()  # closed once
    assert len(other.events("outcome")) == 1


def relaunch(cluster: Any, sessions: bool = True) -> tuple[float, Any]:
    """Rank 1 of a task with ``recovery: restart`` dies: step until the task is relaunched from its
    checkpoint; when that was, and the task then. ``sessions``: the relaunched workers (and any
    after them) start their training sessions at once, and their first step is timed from then."""
    cluster.sessions_start = sessions
    cluster.exit(1)
    for _ in range(100):
        if cluster.c.store.get_task("lm").launched_generation > 1:
            break
        cluster.step(0.5)
    task = cluster.c.store.get_task("lm")
    assert task.state is TaskState.STARTING and task.launched_generation == task.generation > 1
    return cluster.clock.now, task


def test_a_launch_whose_first_step_never_ends_is_a_hang(make: Any) -> None:
    """Relaunched from its checkpoint, the task's workers all run but the first step never ends
    (a rank hung in it): there are no step times of the generation to judge it by, so the
    first step's own deadline finds it, and the stalled launch is handled like any hang."""
    cluster = make(recovery="restart", first_step_timeout_s=30.0)
    relaunched, task = relaunch(cluster)
    while cluster.clock.now - relaunched < 25.0:
        cluster.step(1.0)
    assert cluster.events("hang_detected") == []  # not yet
    for _ in range(10):
        cluster.step(1.0)
    (hang,) = cluster.events("hang_detected")
    assert hang["generation"] == task.generation and hang["step"] == task.checkpoint_step + 1
    incidents = [i for i in cluster.events("incident") if i["kind"] == "task_hang"]
    assert [i["generation"] for i in incidents] == [task.generation]


def test_a_first_step_is_timed_from_its_sessions_start_not_from_the_launch(make: Any) -> None:
    """Relaunched, the workers take 20 s to start their training sessions (importing torch on a
    loaded host), then a rank hangs in the first step: with ``first_step_timeout_s`` at 10 s the
    hang is found 10 s after the last session began (30 s after the launch), not at 10 s (when
    every rank was still starting, none to blame); the start itself is bounded by
    ``start_timeout_s``, not met here."""
    cluster = make(recovery="restart", first_step_timeout_s=10.0, start_timeout_s=60.0)
    relaunched, task = relaunch(cluster, sessions=False)
    while cluster.clock.now - relaunched < 20.0:
        cluster.step(1.0)
    assert cluster.events("hang_detected") == []  # 20 s of start: no session yet, nothing judged
    for key in [k for k in cluster.running if k[:2] == ("lm", task.generation)]:
        cluster.start_session(key)
    cluster.step(1.0)
    began = cluster.clock.now  # the heartbeat that brought the last position
    while cluster.clock.now - began < 9.0:
        cluster.step(1.0)
    assert cluster.events("hang_detected") == []  # within the first step's 10 s
    for _ in range(4):
        cluster.step(1.0)
    (hang,) = cluster.events("hang_detected")
    assert hang["generation"] == task.generation and hang["deadline_s"] == 10.0, hang
    assert hang["step"] == task.checkpoint_step + 1


def test_a_launch_none_of_whose_ranks_reaches_its_session_is_relaunched_at_once(make: Any) -> None:
    """A task recovering in place whose launch never gets going (every worker runs, none has
    reported a position within ``start_timeout_s``: stuck importing or loading) is not the
    network's and cannot re-form in place: no peer check, no grace, no reattempt in place (it
    ended in a relaunch ~20 s later before); it is relaunched from its checkpoint at once."""
    spec = "name: lm\nweight: 1\nthroughput: {1: 1.0e9, 2: 2.0e9, 3: 2.7e9, 4: 3.6e9}\n"
    spec += "run: {program: [python, train.py], iterations: 100, recovery: in_process}\n"
    cluster = make(spec=spec, probes=True, start_timeout_s=30.0)
    task = cluster.c.store.get_task("lm")
    assert task.launched_generation == task.generation and task.step == 0
    for _ in range(40):
        cluster.step(1.0)
        if cluster.events("incident"):
            break
    (hang,) = cluster.events("hang_detected")
    assert hang["why"] == "rank(s) [0, 1, 2, 3] have not reached the training session: stuck starting up", (
        hang
    )
    assert hang["peer_check"] is False and hang["culprits"] == []
    (incident,) = cluster.events("incident")
    assert incident["kind"] == "task_hang" and incident["action"] == "restart from checkpoint", incident
    for _ in range(10):
        cluster.step(1.0)
    again = cluster.c.store.get_task("lm")
    assert again.launched_generation == again.generation > task.generation
    assert cluster.events("in_process_recovery") == [] and cluster.events("peer_check") == []


def test_a_peer_error_of_a_generation_left_behind_starts_no_recovery(make: Any) -> None:
    """A survivor's peer error still waiting for its cause when the task moved on to a new
    generation (a grow switched it meanwhile) belongs to a group that is gone: it is dropped,
    not answered by re-forming the new generation (which the 8-minute chaos soak saw happen at
    every tick, 212 incidents for one task)."""
    cluster = make()
    cluster.exit(1)
    cluster.train(2)  # generation 2 runs
    seen = cluster.clock.now
    cluster.c.recovery.awaiting[("lm", 1)] = (seen, ErrorKind.CONNECTION_RESET, "n0")
    for _ in range(20):
        cluster.step(0.5)
    assert len(cluster.events("incident")) == 1 and cluster.c.store.get_task("lm").generation == 2
    assert cluster.c.recovery.awaiting == {}


def test_a_node_lost_long_enough_is_forgotten_and_one_holding_workers_is_not(make: Any) -> None:
    from unicron.brain.records import NodeRecord
    from unicron.control.place.removal import forgettable
    from unicron.core.kept import NodeErrors
    from unicron.core.ladder import Counted

    cluster = make(heartbeat_deadline_s=2.0, forget_lost_node_s=30.0)
    for _ in range(40):  # n1 goes silent: lost after 2 s, forgotten 30 s after it was last heard
        cluster.clock.now += 0.5
        cluster.beat("n0")
        cluster.c.tick()
        if cluster.c.store.node("n1") is None:
            break
    assert cluster.c.store.node("n1") is not None  # lost, still listed
    ladder = cluster.c.recovery.ladder  # an error counted against n1, kept as its record
    ladder.count(Counted("lm", ErrorKind.CUDA_ERROR, cluster.clock.now, "n1", same=False))
    cluster.c.act.keep_ladder(ladder)
    assert cluster.c.store.kept_record(NodeErrors, of="n1") is not None
    for _ in range(30):
        cluster.clock.now += 0.5
        cluster.beat("n0")
        cluster.c.tick()
    assert cluster.c.store.node("n1") is None and cluster.c.store.node("n0") is not None
    (removed,) = [e for e in cluster.c.store.events(kinds=["node_removed"])]
    assert removed.node == "n1" and "forget_lost_node_s" in removed.detail["why"]
    # Its errors forgotten with it, the record too: a successor restores the errors of the nodes
    # it knows, so one that registers again starts afresh under either coordinator.
    assert "n1" not in ladder.node_errors and cluster.c.store.kept_record(NodeErrors, of="n1") is None

    lost = NodeRecord(1, "gone", 1, [], "h", NodeState.LOST, last_seen=0.0)
    holding = NodeRecord(2, "holding", 1, [], "h", NodeState.LOST, last_seen=0.0)
    recent = NodeRecord(3, "recent", 1, [], "h", NodeState.LOST, last_seen=90.0)
    asked: list[bool] = []

    def held() -> dict[str, dict[str, int]]:
        asked.append(True)
        return {"holding": {"t": 1}}

    assert forgettable([lost, holding, recent], held, now=100.0, after_s=30.0) == ["gone"]
    assert forgettable([recent], held, now=100.0, after_s=30.0) == [] and len(asked) == 1


def test_a_plan_decided_while_a_grow_is_under_way_counts_its_newcomers(make: Any) -> None:
    """Newcomers hold the slots the plan gave them before they join: a plan decided meanwhile
    (another task's grow ended, say) sees the task at the size it is growing to, answers from
    the table and gives their slots to nobody else."""
    cluster = make()
    growth = cluster.grow_under_way(2)
    cluster.c.placer.allocator.wait()  # the table for the state the grow leads to
    state, _ = cluster.c.placer.cluster_state(cluster.c.store.snapshot())
    assert sum(per.get("lm", 0) for per in state.assignment.values()) == 4
    decided = dict(cluster.c.placer.allocator.counts)
    cluster.c.dirty = True  # something else asks for a plan before the newcomers join
    cluster.step()
    assert cluster.c.generations.growing == {"lm": growth}
    assert cluster.c.placer.allocator.counts["solved"] == decided["solved"]
    assert cluster.events("task_resize") == [] and len(cluster.events("task_grow")) == 1


def test_a_relaunchs_first_step_is_judged_by_the_first_launchs_not_by_the_ten_minute_timeout() -> None:
    """The first step's allowance: the full timeout without a measured launch; for a relaunch, k x
    the longest measured first step + the checkpoint allowance, within the timeout and never under
    the heartbeat deadline."""
    from unicron.control.detect.detection import first_step_allowance

    limits = Settings(hang_multiple=3.0, checkpoint_allowance_s=5.0)  # first_step_timeout_s: 600
    assert first_step_allowance(limits, None) == 600.0
    assert first_step_allowance(limits, 4.0) == 3.0 * 4.0 + 5.0
    assert first_step_allowance(limits, 1000.0) == 600.0
    assert first_step_allowance(Settings(checkpoint_allowance_s=0.0), 0.1) == Settings().heartbeat_deadline_s


def test_a_relaunch_whose_first_step_never_ends_is_found_by_the_measured_first_step(make: Any) -> None:
    """The task's first launch took 0.5 s from its last worker's launch to its first step (its workers
    report no position here: a launch is then measured from its last worker's launch). Relaunched
    from its checkpoint, its workers all run but the first step never ends: it is a hang once
    3 x 0.5 s + the 5 s checkpoint allowance have passed, not after the ten-minute timeout of a
    task's first launch (the stalled relaunch is handled like any hang)."""
    cluster = make(recovery="restart", checkpoint_allowance_s=5.0)
    assert cluster.c.detector.first_steps == {"lm": 0.5}
    relaunched, task = relaunch(cluster)
    while cluster.clock.now - relaunched < 6.0:
        cluster.step(0.5)
    assert cluster.events("hang_detected") == []  # not yet: 6.5 s are allowed
    for _ in range(4):
        cluster.step(0.5)
    (hang,) = cluster.events("hang_detected")
    assert hang["generation"] == task.generation and hang["deadline_s"] == 6.5
    assert hang["step"] == task.checkpoint_step + 1  # the relaunch's first step
    incidents = [i for i in cluster.events("incident") if i["kind"] == "task_hang"]
    assert [i["generation"] for i in incidents] == [task.generation]  # handled like any hang


def test_relaunches_whose_first_step_is_late_in_a_row_are_each_allowed_twice_as_long(make: Any) -> None:
    """A host slower now than at the first launch (loaded, its caches cold): each relaunch's first
    step is found late by the measured allowance (6.5 s), so the next relaunch is allowed twice as
    long (13 s, then 26 s), up to the first launch's timeout, instead of being cut off at 6.5 s
    forever (the soak with both cores busy relaunched a task twenty times so)."""
    cluster = make(
        recovery="restart", checkpoint_allowance_s=5.0, same_fault_limit=100, task_failure_limit=100
    )
    relaunch(cluster)
    deadlines: list[float] = []
    for _ in range(400):
        cluster.step(0.5)
        deadlines = [h["deadline_s"] for h in cluster.events("hang_detected")]
        if len(deadlines) == 3:
            break
    assert deadlines == [6.5, 13.0, 26.0]
    assert len({h["generation"] for h in cluster.events("hang_detected")}) == 3  # three launches


def test_every_worker_killed_at_once_is_one_incident_and_blames_no_node(make: Any) -> None:
    """``kill -9`` of every worker: each exit is reported on its own and lands in the generation
    the previous exit's recovery re-formed in place. It is one event: one incident, widened with
    each exit (no new incident, nothing more counted by the ladder), which ends as a restart from
    the checkpoint when nobody is left; the fault struck both nodes alike, so it is the task's
    and no healthy node is isolated (before: three superseded incidents, the task failed as the
    same fault repeated, and a node isolated for its "two errors")."""
    cluster = make(isolation_s=1000.0)
    exits: dict[str, list[ExitReport]] = {}
    for (t, g, r), (node, _) in sorted(cluster.running.items()):
        gone = ExitReport(
            task=t, generation=g, rank=r, node=node, code=None, signal=9, time=cluster.clock.now
        )
        exits.setdefault(node, []).append(gone)
    cluster.running.clear()
    for node, reports in exits.items():
        cluster.beat(node, *reports)
        cluster.clock.now += 0.05
    assert len(cluster.events("incident")) == 1 and len(cluster.events("incident_widened")) == 3
    assert cluster.events("outcome") == []  # nothing superseded, nothing failed
    steps = [(e["from_action"], e["to_action"], e["carried"]) for e in cluster.events("escalation")]
    assert steps == [
        ("restart failed processes", "reconfigure", False),
        ("reconfigure", "restart from checkpoint", True),
    ]
    assert cluster.c.store.get_task("lm").state is TaskState.RESTARTING
    assert [cluster.c.store.node(n).state for n in ("n0", "n1")] == [NodeState.HEALTHY] * 2  # type: ignore[union-attr]
    assert not any(cluster.c.recovery.ladder.node_errors.values())  # the task's fault: taken back
    (opened,) = cluster.c.recovery.incidents.values()
    assert opened.labels() == ["restart failed processes", "restart from checkpoint"]


def test_the_same_event_still_widens_its_incident_after_a_coordinator_restart(make: Any) -> None:
    """The coordinator restarts between two exits of one kill: the restored incident knows the
    generation its tier re-formed, so the second exit widens it rather than opening another."""
    cluster = make()
    task = cluster.c.store.get_task("lm")
    second = cluster.running[("lm", task.generation, 2)]
    cluster.exit(1)
    cluster.restart()
    gen = cluster.c.store.get_task("lm").generation
    cluster.running.pop(("lm", gen, 1), None)  # old rank 2, now rank 1
    gone = ExitReport(task="lm", generation=task.generation, rank=2, node=second[0], code=None, signal=9,
                      time=cluster.clock.now)  # fmt: skip
    cluster.beat(second[0], gone)
    assert len(cluster.events("incident")) == 1 and len(cluster.events("incident_widened")) == 1


def test_each_incident_of_the_same_task_fault_is_counted_once(make: Any) -> None:
    """A relaunch whose worker crashes before step 1, twice: two incidents of the task's own
    fault, counted twice (the attribution of the first counted it once more: "the same task
    fault 3 times" after two incidents)."""
    cluster = make(recovery="restart", same_fault_limit=3)
    cluster.exit(1)  # a running generation: a worker's fault, not counted as the task's
    for crash in range(2):
        cluster.running.clear()
        for _ in range(30):
            cluster.step(0.5)
        assert cluster.c.store.get_task("lm").state is TaskState.STARTING, crash
        cluster.exit(1)
    first, second = cluster.events("incident")[1:]
    assert first["scope"] == second["scope"] == "task"
    assert "the same task fault" not in first["ladder"], first["ladder"]
    (counted,) = cluster.c.recovery.ladder.same.values()
    assert len(counted) == 2 and cluster.c.store.get_task("lm").state is not TaskState.FAILED


def test_a_sev1_error_isolates_its_node_at_once_and_the_grow_back_avoids_it(make: Any) -> None:
    """A worker raises an uncorrectable ECC error (classified in the worker as SEV1: hardware
    that needs repair) and exits. Its node is isolated with its ranks at the first error, the
    others go on in place (nothing relaunched), and the task grows back to four on the healthy
    nodes only: nothing is placed on the isolated node afterwards."""
    cluster = make(nodes=3)
    generation = cluster.c.store.get_task("lm").generation
    node = cluster.running[("lm", generation, 1)][0]
    since = len(cluster.orders)
    cluster.exit(1, error="uncorrectable ECC error")
    (incident,) = cluster.events("incident")
    assert (incident["kind"], incident["severity"]) == ("ecc_error", "SEV1"), incident
    assert [e.node for e in cluster.c.store.events(kinds=["node_isolated"])] == [node]
    assert cluster.c.store.node(node).state is NodeState.ISOLATED  # type: ignore[union-attr]
    assert cluster.events("in_process_recovery")
    for key in [k for k, (n, _) in cluster.running.items() if n == node]:
        del cluster.running[key]  # the isolation's stop, carried out by the node's agent
    cluster.train(2)
    for _ in range(10):
        cluster.step()
        growth = cluster.c.generations.growing.get("lm")
        if growth is not None:
            for rank in growth.newcomers:
                cluster.c.act.rendezvous.set("lm", ready_key("lm", growth.generation, rank), "ready")
        if cluster.c.store.get_task("lm").workers == 4:
            break
    task = cluster.c.store.get_task("lm")
    assert task.workers == 4 and task.generation > generation + 1, task  # grown back to four
    placed = [n for n, o in cluster.orders[since:] if isinstance(o, LaunchWorker)]
    assert placed and node not in placed, placed
    grows = cluster.c.store.events(kinds=["task_grow", "task_launch"], since_id=incident["id"])
    assert grows and all(node not in e.detail["placement"] for e in grows), grows
    assert len(cluster.c.store.events(kinds=["task_launch"])) == 1  # recovered in place


TINYGPT = "{layers: 2, hidden_size: 64, heads: 4, sequence_length: 32, vocabulary: 64, global_batch: 16}"
WEIGHED = f"""
tasks:
  - name: light
    weight: 1
    min_workers: 4
    throughput: {{2: 2.0e9, 4: 3.6e9}}
    run: {{program: [python, train.py], iterations: 30, flops_per_sample: 1.0e7}}
  - name: heavy
    weight: 3
    min_workers: 4
    model: {TINYGPT}
    run: {{program: [python, train.py], iterations: 30}}
"""


def test_the_heavier_of_two_tasks_that_fill_the_cluster_runs_first_and_the_lighter_waits(make: Any) -> None:
    """Two tasks that each run only on all four slots, submitted in one request: the heavier
    (weight 3) runs first, the lighter waits and is launched once the heavier has finished. The
    heavier describes its model: the planner estimates its throughput on the ``--cluster``
    file's GPU (it has no table), and its work counts the model's FLOPs per sample."""
    hardware = "gpu: 2.0e12\nnode_mtbf_hours: 750\n"  # the --cluster file
    cluster = make(spec=WEIGHED, cluster=hardware)
    (started,) = cluster.events("coordinator_started")
    assert (started["peak_flops"], started["node_mtbf_hours"]) == (2.0e12, 750)
    assert len(cluster.launched("heavy")) == 4 and cluster.launched("light") == []
    assert cluster.c.store.get_task("light").state is TaskState.WAITING
    for step in range(1, 31):
        cluster.train(step, "heavy")
    cluster.finish("heavy")
    for _ in range(4):
        cluster.step()
        if cluster.launched("light"):
            break
    assert len(cluster.launched("light")) == 4
    first: dict[tuple[str, str | None], int] = {}
    for e in cluster.c.store.events(task=None):
        first.setdefault((e.kind, e.task), e.id)
    assert (
        first[("task_launch", "heavy")] < first[("task_finished", "heavy")] < first[("task_launch", "light")]
    )
    heavy = cluster.c.store.get_task("heavy")
    model = ModelSpec.model_validate(yaml.safe_load(TINYGPT))
    assert heavy.state is TaskState.FINISHED and heavy.samples == 30 * 16
    assert heavy.flop == pytest.approx(3 * heavy.samples * flops_per_sample(model))  # its weighted_flop
    # Weighed the other way (light worth far more), light runs first and heavy waits.
    other = make(spec=WEIGHED.replace("weight: 1\n", "weight: 1000\n"), cluster=hardware)
    assert len(other.launched("light")) == 4 and other.launched("heavy") == []
    assert other.c.store.get_task("heavy").state is TaskState.WAITING


def test_a_replica_mate_whose_own_sums_arrived_is_not_blamed_for_a_lost_node(make: Any) -> None:
    """Replicas of two ranks; a node holding one replica is lost (its agent with it, so only its
    silence will name its ranks). Of the other replica, rank 0's sum over the peers broke
    (connection closed) while rank 1's arrived, so rank 1 raises the library's PeerLostError
    (``replicas.all_or_none``: the replica redoes the step together). Both are consequences of
    the peers' loss and wait for its cause, as a connection error does: blaming rank 1 took its
    healthy replica out (rank 1 stopped) and kept the lost node's ranks, and a live test missed
    that replica's ledger lines for the step (test_live_sharded, under load)."""
    spec = (
        "name: lm\nweight: 1\nthroughput: {2: 2.0e9, 4: 3.6e9}\n"
        "run: {program: [python, train.py], iterations: 100, recovery: in_process, replica_size: 2}\n"
    )
    cluster = make(spec=spec, heartbeat_deadline_s=2.0)
    assert len(cluster.launched()) == 4
    cluster.train(1)
    for _ in range(5):  # both heard past an agent's request timeout since the coordinator started
        cluster.step(0.5)
    placed = {r: n for (_, g, r), (n, _) in cluster.running.items() if g == 1}
    lost, kept = placed[2], placed[0]
    assert placed[3] == lost and placed[1] == kept != lost
    mro = ("PeerLostError", "ConnectionError", "OSError", "Exception", "BaseException", "object")
    reasons = [
        (0, "RuntimeError", "Connection closed by peer [127.0.0.1]:5117", ("RuntimeError",)),
        (1, "PeerLostError", "another shard of this replica lost its peers: the step is redone", mro),
    ]
    reports = [
        ExceptionReport(
            task="lm",
            generation=1,
            rank=rank,
            step=2,
            error_type=error,
            message=message,
            kind=classify(error, message, names).value,  # as the worker classifies it
            time=cluster.clock.now,
        )
        for rank, error, message, names in reasons
    ]
    cluster.beat(kept, *reports)
    for _ in range(8):  # the lost node stays silent
        cluster.clock.now += 0.5
        cluster.beat(kept)
        cluster.c.tick()
    (incident,) = cluster.events("incident")
    assert incident["kind"] == "node_lost", incident
    (recovery,) = cluster.events("in_process_recovery")
    assert recovery["failed"] == [2, 3] and recovery["survivors"] == [0, 1], recovery
    assert not [o for _, o in cluster.orders if isinstance(o, StopWorkers) and o.rank in (0, 1)]


def test_values_deleted_from_a_tasks_store_are_put_back_and_said_once_a_minute(make: Any) -> None:
    """The rendezvous store takes deletions from anyone: the coordinator puts its values back
    within a second, records it at once, and while the attack goes on at most once a minute."""
    from unicron.core.protocol import current_key

    cluster = make()
    store = cluster.c.act.rendezvous._stores["lm"]
    for attack in range(5):  # one deletion every 20 s, while the task trains on
        store.delete_key(current_key("lm"))
        cluster.clock.now += 1.5
        cluster.c.tick()
        assert store.check([current_key("lm")]), f"attack {attack}: not put back"
        for step in range(2 + 10 * attack, 12 + 10 * attack):
            cluster.clock.now += 1.85
            cluster.train(step)
            cluster.c.tick()
    assert cluster.c.store.get_task("lm").generation == 1  # nothing else happened to the task
    said = cluster.events("store_values_restored")
    assert [e["values"] for e in said] == [1, 3]  # at once, then the three since a minute later
    assert said[0]["keys"] == [current_key("lm")]


def test_a_heartbeat_that_changes_nothing_writes_nothing(make: Any) -> None:
    """A training node's plain heartbeat (its workers listed, no report) is held in memory: it
    writes nothing to the store, so thousands of nodes beating cost no disk or etcd writes
    (docs/scale.md); when the node was last heard is still known."""
    cluster = make()
    writes: list[int] = []
    backend = cluster.c.store.backend
    write = backend.write
    backend.write = lambda changes, events=(): (
        writes.append(len(changes) + len(events)),
        write(changes, events),
    )
    for _ in range(3):
        cluster.clock.now += 0.5
        for node in cluster.nodes:
            cluster.beat(node)
    assert writes == []
    assert cluster.c.store.node("n0").last_seen == cluster.clock.now

"""Slots held by processes that are gone: the rows of an ended task whose exits went unrecorded
(``control/detect/vanished.py``). The rule, on hand-built rows; then the coordinator stepped by hand
(tests/fakecluster.py), where such a row kept the next task from ever starting."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from unicron.brain.records import TaskRecord, WorkerRecord
from unicron.control.detect.vanished import Listing, gone
from unicron.core.livespecs import parse_live_tasks
from unicron.core.protocol import (
    CheckpointReport,
    DoneReport,
    ExitReport,
    LaunchWorker,
    Registration,
    WorkerState,
)
from unicron.core.states import TaskState, WorkerPhase

NEXT = """
name: next
weight: 1
throughput: {1: 1.0e9, 2: 2.0e9, 3: 2.7e9, 4: 3.6e9}
run: {program: [python, train.py], iterations: 100}
"""


def _listed(at: float, *workers: tuple[str, int, int, int, bool]) -> Listing:
    return Listing.of(
        [WorkerState(task=t, generation=g, rank=r, pid=pid, running=up) for t, g, r, pid, up in workers], at
    )


def test_a_row_of_an_ended_task_is_gone_only_when_its_node_listed_it_not_running_after_the_end(
    make: Any,
) -> None:
    cluster = make()
    task: TaskRecord = cluster.c.store.get_task("lm")
    row: WorkerRecord = cluster.c.store.worker("lm", task.generation, 0)
    pid, node, now = row.pid, row.node, cluster.clock.now
    assert pid is not None
    ended = replace(task, state=TaskState.FINISHED, finished=now)
    key = ("lm", task.generation, 0)

    def found(r: WorkerRecord, t: TaskRecord, listing: Listing | None) -> bool:
        listings = {} if listing is None else {node: listing}
        return gone([r], {"lm": t}, listings, now + 10, launch_timeout_s=120.0) == [r]

    nothing = _listed(now + 5)
    assert found(row, ended, nothing)
    assert not found(row, task, nothing)  # a running task's workers are judged by its own guards
    assert not found(row, ended, None)  # nothing heard from the node
    assert not found(row, ended, _listed(now - 1))  # a list from before the end
    assert not found(row, ended, _listed(now + 5, (*key, pid, True)))
    assert found(row, ended, _listed(now + 5, (*key, pid, False)))  # listed, but exited
    # Renamed in place: listed under its former identity until its agent catches up.
    assert not found(row, ended, _listed(now + 5, ("lm", task.generation - 1, 3, pid, True)))
    # Never seen running (a spare, or a launch): its order may not have been carried out yet.
    unseen = replace(row, pid=None, state=WorkerPhase.SPARE, launched=now)
    assert not found(unseen, ended, nothing)
    assert found(replace(unseen, launched=now - 200), ended, nothing)


def test_a_finished_tasks_worker_whose_exit_went_unrecorded_frees_its_slot_for_the_next_task(
    make: Any,
) -> None:
    """``lm`` finishes; rank 3's exit is never recorded (lost with a coordinator killed before it
    was durable, and its agent has forgotten the process). Its row held its slot, so ``next``,
    planned onto all four slots, waited for it for ever; now its node's list ends it."""
    cluster = make()
    generation = cluster.c.store.get_task("lm").generation
    cluster.train(100)
    node0, _ = cluster.running[("lm", generation, 0)]
    cluster.beat(node0, DoneReport(task="lm", generation=generation, rank=0, step=100, digest="d"))
    nodes = {r: cluster.running[("lm", generation, r)][0] for r in range(4)}
    cluster.exit(0, code=0)  # the final state is saved: the others are stopped
    assert cluster.c.store.get_task("lm").state is TaskState.FINISHED
    for rank in (1, 2, 3):
        cluster.running.pop(("lm", generation, rank), None)  # the agents stopped them
    for rank in (1, 2):  # their exits are recorded; rank 3's never is
        stopped = ExitReport(
            task="lm",
            generation=generation,
            rank=rank,
            node=nodes[rank],
            code=None,
            signal=15,
            stop_ordered=True,
        )
        cluster.beat(nodes[rank], stopped)
    assert cluster.c.store.worker("lm", generation, 3).state is WorkerPhase.RUNNING
    cluster.c.submit(*parse_live_tasks(NEXT, "test"))
    cluster.c.placer.allocator.wait()
    for _ in range(6):
        cluster.step()
    launched = [o for _, o in cluster.orders if isinstance(o, LaunchWorker) and o.task == "next"]
    assert len(launched) == 4
    assert cluster.c.store.worker("lm", generation, 3).state is WorkerPhase.STOPPED
    (gone_event,) = cluster.events("worker_gone")
    assert (gone_event["generation"], gone_event["rank"]) == (generation, 3)


def test_a_running_task_past_its_last_step_whose_workers_vanished_with_the_final_state_is_relaunched(
    make: Any,
) -> None:
    """Past the last step hang detection stands aside. The agent of rank 0's node is restarted
    there: ranks 0 and 1 are gone, their reports with them (rank 0's of the final state too).
    Ranks 2 and 3 leave cleanly, and the task waited for the two gone for ever; now their node's
    list tells, and with no final state known saved the task is relaunched from its checkpoint."""
    cluster = make()
    generation = cluster.c.store.get_task("lm").generation
    cluster.train(90)
    n0 = cluster.running[("lm", generation, 0)][0]
    saved = CheckpointReport(task="lm", generation=generation, rank=0, step=90, path="step-90")
    cluster.beat(n0, saved)
    cluster.train(100)
    gone_ranks = sorted(r for (t, g, r), (n, _) in cluster.running.items() if n == n0)
    assert 0 in gone_ranks
    for rank in gone_ranks:
        cluster.running.pop(("lm", generation, rank))  # restarted agent: it knows nothing of them
    for rank in sorted({0, 1, 2, 3} - set(gone_ranks)):
        cluster.exit(rank, code=0)
    for _ in range(4):
        cluster.step()
    task = cluster.c.store.get_task("lm")
    assert task.generation > generation and task.state is not TaskState.RUNNING  # relaunched
    assert sorted(e["rank"] for e in cluster.events("worker_gone")) == gone_ranks
    for rank in gone_ranks:
        assert cluster.c.store.worker("lm", generation, rank).state is WorkerPhase.LOST
    # From its checkpoint; the node was not lost (its agent's list told).
    assert [e["resume_from"] for e in cluster.events("task_launch")] == [0, 90]
    assert cluster.events("node_lost") == []


def test_a_running_task_past_its_last_step_finishes_when_the_final_state_was_reported(make: Any) -> None:
    """The same, but rank 0 reported the final state before its agent was restarted: the task
    finishes (rank 0's DoneReport already ends it once rank 0 exits; here rank 0 is the one gone,
    so only its vanishing tells)."""
    cluster = make()
    generation = cluster.c.store.get_task("lm").generation
    cluster.train(100)
    n0 = cluster.running[("lm", generation, 0)][0]
    cluster.beat(n0, DoneReport(task="lm", generation=generation, rank=0, step=100, digest="d"))
    cluster.slow_stops |= {"n0", "n1"}
    gone_ranks = sorted(r for (t, g, r), (n, _) in cluster.running.items() if n == n0)
    for rank in gone_ranks:
        cluster.running.pop(("lm", generation, rank))
    for _ in range(4):
        cluster.step()
    assert cluster.c.store.get_task("lm").state is TaskState.FINISHED
    assert cluster.c.store.get_task("lm").generation == generation  # nothing relaunched


def test_a_running_tasks_workers_gone_with_their_agent_before_the_last_step_are_left_behind_in_place(
    make: Any,
) -> None:
    """The agent of one node is restarted mid-training, its workers dying with it: nothing reports
    their exits. The survivors' errors name no dead rank, so the task waited
    ``heartbeat_deadline_s`` + ``cause_grace_s`` for a death never reported, then re-formed with
    the dead ranks and waited for them again. Now the node's next list tells: the gone ranks are
    taken as failed and the survivors go on in place without them (nothing relaunched)."""
    cluster = make()
    generation = cluster.c.store.get_task("lm").generation
    cluster.train(50)
    node = cluster.running[("lm", generation, 3)][0]
    gone_ranks = sorted(r for (t, g, r), (n, _) in cluster.running.items() if n == node)
    kept_pids = sorted(pid for (t, g, r), (n, pid) in cluster.running.items() if n != node)
    for rank in gone_ranks:
        cluster.running.pop(("lm", generation, rank))  # restarted agent: it knows nothing of them
    cluster.step()  # one heartbeat interval
    task = cluster.c.store.get_task("lm")
    (incident,) = cluster.events("incident")
    assert incident["kind"] == "exited_abnormally" and incident["generation"] == generation
    assert sorted(e["rank"] for e in cluster.events("worker_gone")) == gone_ranks
    for rank in gone_ranks:
        assert cluster.c.store.worker("lm", generation, rank).state is WorkerPhase.LOST
    # In place: the survivors form the next generation; nothing new was launched.
    assert task.generation == generation + 1
    survivors = cluster.c.store.workers("lm", task.generation, live=True)
    assert sorted(w.pid for w in survivors) == kept_pids
    assert len([o for _, o in cluster.orders if isinstance(o, LaunchWorker)]) == 4


def test_a_starting_tasks_workers_gone_with_their_agent_are_taken_out_not_waited_for(make: Any) -> None:
    """A launch before its first step, one node's agent restarted (its workers die with it): only
    the start time-out (ten minutes) would have ended the wait (the soak's cluster stood still for
    it). Now the node's next list tells: the gone ranks are failed, and the task recovers."""
    cluster = make(spec=NEXT.replace("name: next", "name: lm"))
    cluster.step()  # the agents list their workers: running, with pids
    task = cluster.c.store.get_task("lm")
    assert task.state is TaskState.STARTING and task.workers == 4
    generation = task.generation
    node = cluster.running[("lm", generation, 3)][0]
    gone_ranks = sorted(r for (t, g, r), (n, _) in cluster.running.items() if n == node)
    for rank in gone_ranks:
        cluster.running.pop(("lm", generation, rank))
    cluster.step()
    assert sorted(e["rank"] for e in cluster.events("worker_gone")) == gone_ranks
    (incident,) = cluster.events("incident")
    assert incident["kind"] == "exited_abnormally" and incident["generation"] == generation
    assert cluster.c.store.get_task("lm").generation > generation  # recovering, not waiting


def test_a_worker_a_registration_tells_of_is_not_judged_by_the_list_before_it(make: Any) -> None:
    """A launch's processes not yet started when their node lists; its agent starts them, loses
    the coordinator for a moment and registers again, telling their pids; the coordinator ticks
    before the node lists again. The list heard before the processes started is no measure of
    them: nothing is taken out (found by review: a starting task's healthy workers were)."""
    cluster = make(nodes=3)
    cluster.c.submit(*parse_live_tasks(NEXT, "test"))
    cluster.c.placer.allocator.wait()
    for _ in range(5):
        cluster.step()
        if cluster.launched("next"):
            break
    held = {k: v for k, v in cluster.running.items() if k[0] == "next"}
    assert held and cluster.c.store.get_task("next").state is TaskState.STARTING
    for key in held:
        cluster.running.pop(key)  # not started yet when the node lists
    cluster.step()
    cluster.running.update(held)
    listed = [
        WorkerState(task=t, generation=g, rank=r, pid=pid, running=True)
        for (t, g, r), (_, pid) in held.items()
    ]
    node = next(iter(held.values()))[0]
    cluster.c.register(Registration(node=node, slots=2, workers=listed, sent=cluster.clock.now))
    cluster.clock.now += 1.0
    cluster.c.tick()
    assert cluster.events("worker_gone") == []


def test_a_cancelled_tasks_workers_gone_with_their_agent_free_their_slots_for_the_next_task(
    make: Any,
) -> None:
    """The node's agent dies with its workers and is started again before the node is declared
    lost: nothing reports their exits. The task is cancelled before the node's next heartbeat:
    it has no guard of its own any more, and its rows held the node's slots for good, so the
    next task waited for them for ever. The node's list ends them."""
    cluster = make(nodes=1, slots=4)
    generation = cluster.c.store.get_task("lm").generation
    gone_ranks = sorted(r for (t, g, r) in cluster.running if (t, g) == ("lm", generation))
    assert gone_ranks == [0, 1, 2, 3]
    cluster.running.clear()  # restarted agent: it knows nothing of them
    cluster.c.cancel("lm")
    assert {cluster.c.store.worker("lm", generation, r).state for r in gone_ranks} == {WorkerPhase.RUNNING}
    cluster.c.submit(*parse_live_tasks(NEXT, "test"))
    cluster.c.placer.allocator.wait()
    for _ in range(6):
        cluster.step()
    assert len([o for _, o in cluster.orders if isinstance(o, LaunchWorker) and o.task == "next"]) == 4
    assert sorted(e["rank"] for e in cluster.events("worker_gone")) == gone_ranks
    assert cluster.events("node_lost") == []  # ended by the agent's list, not with the node


def test_a_row_never_seen_is_ended_once_its_launch_time_is_out_though_its_node_lists_no_more(
    make: Any,
) -> None:
    """A sweep judges the rows of the nodes that listed since the last one; a row never seen (no
    pid) is first given its launch time, so its node is judged again each pass until then: a
    spare of an ended task whose node then fell silent is ended all the same (nothing else
    ends a spare's row on a lost node)."""
    from unicron.core.protocol import SPARE_GENERATION

    cluster = make()
    c, now = cluster.c, cluster.clock.now
    node = c.store.nodes()[0].name
    (spare,) = c.store.add_workers("ended", SPARE_GENERATION, {node: 1}, 1000, WorkerPhase.SPARE, now)
    limits = c.ctx.limits
    c.vanished.listed(node, [], now + 1.0)  # its agent lists nothing (the launch not carried out)
    c.vanished.sweep(now + 1.0 + limits.heartbeat_interval_s)
    assert c.store.worker(*spare.key).state is WorkerPhase.SPARE  # within its launch time
    c.vanished.sweep(now + limits.launch_timeout_s + 2 * limits.heartbeat_interval_s)  # no new list
    assert c.store.worker(*spare.key).state is WorkerPhase.STOPPED


def test_a_tasks_ranks_gone_on_two_nodes_are_taken_out_together_whichever_listed_last(
    make: Any,
) -> None:
    """A pass judges the nodes that listed since the last one; once it finds a running task's
    rank gone, it judges that task's rows on every node against their latest lists, so a rank
    whose node's list (lacking it) was read by an earlier pass (the task was then starting) is
    taken out with the first, not left for the recovery to take for a survivor."""
    cluster = make()
    c, generation = cluster.c, cluster.c.store.get_task("lm").generation
    cluster.train(5)
    node_of = {r: cluster.running[("lm", generation, r)][0] for r in range(4)}
    other = next(r for r in range(4) if node_of[r] != node_of[0])
    now = cluster.clock.now + 1.0

    def lacking(rank: int) -> list[WorkerState]:
        """``rank``'s node's list without it (its agent restarted, the worker died with it)."""
        here = [(key, pid) for key, (n, pid) in cluster.running.items() if n == node_of[rank]]
        return [
            WorkerState(task=t, generation=g, rank=r, pid=pid, running=True)
            for (t, g, r), pid in here
            if r != rank
        ]

    assert c.vanished.sweep(now).exits == ()  # what every node listed so far: all there
    c.vanished.listings[node_of[other]] = Listing.of(lacking(other), now)  # read by an earlier pass
    c.vanished.listed(node_of[0], lacking(0), now)  # listed since
    swept = c.vanished.sweep(now + c.ctx.limits.heartbeat_interval_s)
    assert sorted(e.rank for e, _ in swept.exits) == [0, other]


def test_a_list_lacking_a_running_rank_is_judged_at_the_next_pass_not_an_interval_later(make: Any) -> None:
    """Each pass (every tick) judges the nodes that listed since the last one: a rank its agent
    no longer lists is taken out at the next tick, not when a heartbeat interval has passed since
    the last pass (which judged every node at once: ~40 ms of the loop at 2,048 nodes)."""
    cluster = make()
    c, generation = cluster.c, cluster.c.store.get_task("lm").generation
    cluster.train(5)
    now = cluster.clock.now + 1.0
    assert c.vanished.sweep(now).exits == ()  # (a pass: every node's list so far is judged)
    node = cluster.running[("lm", generation, 1)][0]
    here = [(key, pid) for key, (n, pid) in cluster.running.items() if n == node and key[2] != 1]
    c.vanished.listed(
        node, [WorkerState(task=t, generation=g, rank=r, pid=p, running=True) for (t, g, r), p in here], now
    )
    soon = now + c.ctx.limits.heartbeat_interval_s / 10  # the next tick
    assert [e.rank for e, _ in c.vanished.sweep(soon).exits] == [1]

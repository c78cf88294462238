"""New processes start only where they fit beside the processes still holding slots
(``control/place/slots.py``): pure rules, then a plan that stops one task for another, stepped by hand."""

from __future__ import annotations

from typing import Any

from unicron.brain.membership import new_processes
from unicron.control.place.slots import fits
from unicron.core.livespecs import parse_live_tasks
from unicron.core.protocol import DoneReport, ExitReport, LaunchWorker
from unicron.core.states import TaskState, WorkerPhase

BIG = """
name: big
weight: 10
throughput: {4: 9.0e9}
run: {program: [python, train.py], iterations: 100}
"""


def test_spares_take_newcomers_places_on_their_own_node_first_then_where_most_are_wanted() -> None:
    assert new_processes({"a": 2, "b": 1}, []) == {"a": 2, "b": 1}
    assert new_processes({"a": 2, "b": 1}, ["b"]) == {"a": 2}
    assert new_processes({"a": 2, "b": 1}, ["c"]) == {"a": 1, "b": 1}  # a spare elsewhere
    assert new_processes({"a": 1}, ["a", "b", "c"]) == {}  # no more spares used than newcomers


def test_processes_fit_only_beside_those_still_holding_slots() -> None:
    slots = {"a": 2, "b": 2}
    assert fits({"a": 2}, {}, slots)
    assert not fits({"a": 2}, {"a": 1}, slots)  # one process still there
    assert fits({"a": 1}, {"a": 1}, slots)
    assert not fits({"c": 1}, {}, slots)  # a node without slots (gone)
    assert fits({"a": 0}, {"a": 2}, slots)


def test_a_task_that_takes_a_stopping_tasks_slots_starts_once_its_workers_have_exited(make: Any) -> None:
    cluster = make()
    cluster.c.submit(*parse_live_tasks(BIG, "test"))
    cluster.c.placer.allocator.wait()
    cluster.step()
    # The plan gives big every slot and stops lm, whose four workers save and exit meanwhile.
    assert cluster.c.store.get_task("lm").state is TaskState.RESTARTING
    for _ in range(4):
        cluster.step(0.1)
    assert not [o for _, o in cluster.orders if isinstance(o, LaunchWorker) and o.task == "big"]
    assert cluster.c.placer.held
    generation = cluster.c.store.get_task("lm").generation
    for (task, gen, rank), (node, _) in sorted(cluster.running.items()):
        if task == "lm" and gen == generation:
            del cluster.running[(task, gen, rank)]
            killed = rank == 3  # one was still saving when the stop's SIGKILL came
            cluster.beat(
                node,
                ExitReport(
                    task=task,
                    generation=gen,
                    rank=rank,
                    node=node,
                    code=None if killed else 0,
                    signal=9 if killed else None,
                    time=cluster.clock.now,
                    stop_ordered=True,
                ),
            )
    for _ in range(3):
        cluster.step(0.1)
    launched = [o for _, o in cluster.orders if isinstance(o, LaunchWorker) and o.task == "big"]
    assert sorted(o.rank for o in launched) == [0, 1, 2, 3]
    assert {o.local_rank for o in launched} == {0, 1}  # the nodes' own devices, no other
    assert not cluster.c.placer.held
    # The one our stop order killed is recorded as stopped, not as failed.
    phases = {w.rank: w.state for w in cluster.c.store.workers("lm", generation)}
    exited, stopped = WorkerPhase.EXITED, WorkerPhase.STOPPED
    assert phases == {0: exited, 1: exited, 2: exited, 3: stopped}


NEXT = """
name: next
weight: 0.1
throughput: {4: 1.0e9}
run: {program: [python, train.py], iterations: 100}
"""


def test_a_plan_waiting_for_slots_is_carried_out_again_not_decided_again(make: Any) -> None:
    cluster = make()
    cluster.c.submit(*parse_live_tasks(NEXT, "test"))  # no slot is free: it waits for lm
    cluster.c.placer.allocator.wait()
    cluster.step()
    assert cluster.c.store.get_task("next").state is TaskState.WAITING
    # lm ends: rank 0 saved the final state, rank 1 exited, the others are still on their way out.
    cluster.train(100)
    generation = cluster.c.store.get_task("lm").generation
    node, _ = cluster.running[("lm", generation, 0)]
    cluster.beat(node, DoneReport(task="lm", generation=generation, rank=0, step=100, digest="d"))
    cluster.slow_stops |= {"n0", "n1"}  # the workers stopped are listed until they have exited
    cluster.exit(1, code=0)
    cluster.step(0.1)
    assert cluster.c.store.get_task("lm").state is TaskState.FINISHED
    decided = dict(cluster.c.placer.allocator.counts)
    for _ in range(5):
        cluster.step(0.1)
    assert not [o for _, o in cluster.orders if isinstance(o, LaunchWorker) and o.task == "next"]
    assert cluster.c.placer.held is not None
    assert cluster.c.placer.allocator.counts == decided  # carried out again, not decided again
    leaving = cluster.c.store.workers("lm", generation, live=True)
    assert sorted(w.rank for w in leaving) == [0, 2, 3]
    for w in leaving:
        cluster.running.pop(w.key, None)
        report = ExitReport(task="lm", generation=generation, rank=w.rank, node=w.node, code=0, signal=None)
        cluster.beat(w.node, report)
    cluster.step(0.1)
    launched = [o for _, o in cluster.orders if isinstance(o, LaunchWorker) and o.task == "next"]
    assert sorted(o.rank for o in launched) == [0, 1, 2, 3] and {o.local_rank for o in launched} == {0, 1}
    assert cluster.c.placer.held is None and cluster.c.placer.allocator.counts == decided

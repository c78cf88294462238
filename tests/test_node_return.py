"""A node that comes back, stepped by hand (tests/fakecluster.py): what it is told to free and
which state it returns in (a drain or an isolation outlasts its loss)."""

from __future__ import annotations

from typing import Any

from unicron.core.protocol import ForgetTask, LaunchWorker, Registration
from unicron.core.states import NodeState


def test_a_node_back_from_the_dead_frees_the_copies_of_tasks_that_ended_meanwhile(make: Any) -> None:
    """Tasks ending free every node's in-memory checkpoints, but a lost node gets no order: when
    it registers again it is told to free those of the tasks that ended while it was away."""
    cluster = make()
    for _ in range(14):  # n1 goes silent: lost (heard only just after the start: the retry pause too)
        cluster.clock.now += 0.5
        cluster.beat("n0")
        cluster.c.tick()
    assert cluster.c.store.node("n1").state is NodeState.LOST  # type: ignore[union-attr]
    cluster.c.cancel("lm")
    assert not [o for node, o in cluster.orders if node == "n1" and isinstance(o, ForgetTask)]
    cluster.c.register(Registration(node="n1", slots=2))
    cluster.step()
    freed = [o for node, o in cluster.orders if node == "n1" and isinstance(o, ForgetTask)]
    assert [o.task for o in freed] == ["lm"]


def test_a_drained_node_lost_and_back_stays_drained_until_resumed(make: Any) -> None:
    """A drain outlasts the agent (a node rebooted for its maintenance comes back drained, as
    Slurm keeps state=drain): nothing is placed there until an admin resumes it."""
    cluster = make()
    cluster.c.drain_node("n1", "new disk")
    for _ in range(14):  # n1 reboots: silent, lost (after the retry pause: heard just after the start)
        cluster.clock.now += 0.5
        cluster.beat("n0")
        cluster.c.tick()
    assert cluster.c.store.node("n1").state is NodeState.LOST  # type: ignore[union-attr]
    cluster.c.register(Registration(node="n1", slots=2))
    assert cluster.c.store.node("n1").state is NodeState.DRAINING  # type: ignore[union-attr]
    before = len(cluster.orders)
    cluster.step()
    assert not [o for node, o in cluster.orders[before:] if node == "n1" and isinstance(o, LaunchWorker)]
    cluster.c.resume_node("n1")
    assert cluster.c.store.node("n1").state is NodeState.HEALTHY  # type: ignore[union-attr]
    for _ in range(8):  # lost again once resumed: back healthy
        cluster.clock.now += 0.5
        cluster.beat("n0")
        cluster.c.tick()
    cluster.c.register(Registration(node="n1", slots=2))
    assert cluster.c.store.node("n1").state is NodeState.HEALTHY  # type: ignore[union-attr]


def test_a_drains_plan_says_the_tasks_move_off_the_node_not_that_they_lost_it(make: Any) -> None:
    """A drain is answered from the plan table as the node's leaving is, but said in a drain's
    words: nothing was lost with the node (it said "lost 2 GPUs with the node")."""
    cluster = make()
    cluster.c.placer.allocator.wait()  # the table for the cluster as it runs
    cluster.c.drain_node("n1", "new disk")
    for _ in range(3):
        cluster.step()
    plan = cluster.events("plan")[-1]
    assert plan["answers"] == "node-drained:n1" and plan["source"] == "table"
    (shrink,) = cluster.events("task_shrink")
    assert shrink["reason"].startswith("moves 2 GPUs off the drained node"), shrink["reason"]


def test_the_only_node_lost_and_back_gets_its_task_back_whole(make: Any) -> None:
    """The table built while no node is in service plans the node's return with that node's
    slots (it planned one slot: a task of 4 came back on 1, one of 2 or 4 on none, and never
    relaunched)."""
    cluster = make("in_process", nodes=1, slots=4)
    c = cluster.c
    cluster.train(3)
    cluster.step(0.5)
    for _ in range(60):  # n0 falls silent: lost
        cluster.clock.now += 0.5
        c.placer.allocator.wait()
        c.tick()
        if c.store.node("n0").state is NodeState.LOST:
            break
    c.register(Registration(node="n0", slots=4))
    for _ in range(6):
        cluster.step(0.5)
    back = [e for e in cluster.events("plan") if e["answers"] == "node-back:n0"]
    assert back and back[-1]["allocation"] == {"lm": 4}, back

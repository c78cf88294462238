"""Every cluster event reaches the planner as itself (``control/act/happened.py``) and is answered
from the plan table, whatever the task's recovery mode: stepped by hand (tests/fakecluster.py)."""

from __future__ import annotations

from typing import Any

import pytest

from unicron.core.protocol import Registration
from unicron.core.states import NodeState, TaskState


def silence(cluster: Any, node: str, until: NodeState = NodeState.LOST) -> None:
    """``node``'s agent stops beating until the coordinator takes it as ``until``."""
    for _ in range(40):
        cluster.clock.now += 0.5
        for other in cluster.nodes:
            if other != node:
                cluster.beat(other)
        cluster.c.tick()
        if cluster.c.store.node(node).state is until:
            return
    raise AssertionError(f"{node} never became {until}")


def settle(cluster: Any, task: str = "lm") -> None:
    """Steps until ``task`` runs again with every worker it was given, and no plan is being
    solved (one solved in the background is carried out on the tick after it is done)."""
    allocator = cluster.c.placer.allocator
    for _ in range(30):
        cluster.step()
        allocator.wait()
        record = cluster.c.store.get_task(task)
        if record.state is TaskState.STARTING:
            cluster.train(record.step + 1, task)
        if cluster.c.store.get_task(task).state is TaskState.RUNNING and allocator.solving is None:
            return
    raise AssertionError(f"{task} never ran again: {cluster.c.store.get_task(task)}")


@pytest.mark.parametrize("recovery", ["in_process", "restart"])
def test_a_node_lost_and_back_are_looked_up_whatever_the_recovery(make: Any, recovery: str) -> None:
    """A relaunching task has no worker left when the plan comes (before: the event was guessed by
    diffing states, and a relaunch's moved workers made it "beyond the event": solved)."""
    cluster = make(recovery)
    cluster.c.placer.allocator.wait()  # the table of the cluster as it runs
    silence(cluster, "n1")
    settle(cluster)
    plans = cluster.events("plan")
    lost = next(p for p in plans if p["answers"] == "node-lost:n1")
    assert lost["source"] == "table", lost
    cluster.c.register(Registration(node="n1", slots=2))
    cluster.c.placer.allocator.wait()
    settle(cluster)
    back = [p for p in cluster.events("plan") if p["answers"] == "node-back:n1"]
    assert back and all(p["source"] == "table" for p in back), cluster.events("plan")
    assert not [p for p in cluster.events("plan") if p["source"] == "solved" and p["answers"]]


def test_a_relaunch_with_no_cluster_event_is_the_tables_own_plan(make: Any) -> None:
    """A crash that relaunches the task from its checkpoint changes no node and no task: the
    table's plan for the cluster as it is, laid over the workers as they are (not solved)."""
    cluster = make("restart")
    cluster.c.placer.allocator.wait()
    before = dict(cluster.c.placer.allocator.counts)
    cluster.exit(1, error="CUDA error: an illegal memory access was encountered")
    settle(cluster)
    counts = cluster.c.placer.allocator.counts
    assert counts["solved"] == before["solved"] and counts["table"] > before["table"], counts


def test_several_events_before_a_plan_are_solved_and_the_plan_says_which(make: Any) -> None:
    """Two nodes lost before the next plan: the table holds single events only. The plan event
    names both and says why it was solved."""
    cluster = make("in_process", nodes=4, slots=1)
    cluster.c.placer.allocator.wait()
    for _ in range(40):  # n2 and n3 fall silent together
        cluster.clock.now += 0.5
        for node in ("n0", "n1"):
            cluster.beat(node)
        cluster.c.tick()
        if all(cluster.c.store.node(n).state is NodeState.LOST for n in ("n2", "n3")):
            break
    settle(cluster)
    solved = [p for p in cluster.events("plan") if p["source"] == "solved"]
    assert solved, cluster.events("plan")
    assert solved[-1]["answers"] == "node-lost:n2, node-lost:n3", solved[-1]
    assert solved[-1]["why"].startswith("2 events at once"), solved[-1]

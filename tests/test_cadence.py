"""The heartbeat cadence for the cluster's size (core/cadence.py), as values; and through the
coordinator on a fake clock: agents are told it in every answer, a silent node is judged by the
deadline in effect, and after the interval shrinks by the longer one until every agent heard."""

from __future__ import annotations

from typing import Any

from unicron.core.cadence import Cadence, Pace, cadence_for, jittered, widest_scale
from unicron.core.protocol import Heartbeat, Registration
from unicron.core.settings import Settings
from unicron.core.states import NodeState

LIMITS = Settings()


def test_the_interval_and_deadline_grow_with_the_node_count_within_the_budget() -> None:
    base = Cadence(LIMITS.heartbeat_interval_s, LIMITS.heartbeat_deadline_s)
    assert cadence_for(0, LIMITS) == base
    assert cadence_for(500, LIMITS) == base  # 1,000 beats a second: the budget
    at_1024 = cadence_for(1024, LIMITS)
    assert at_1024 == Cadence(1.125, 5.625)  # quarter steps of the interval, the deadline alike
    assert 1024 / at_1024.interval_s <= LIMITS.heartbeat_rate_max
    assert cadence_for(2048, LIMITS) == Cadence(2.125, 10.625)
    # The widest: its deadline 0.75 of the shortest setting a loss must come before (recovery's 20 s).
    assert widest_scale(LIMITS) == 6.0
    assert cadence_for(4096, LIMITS) == cadence_for(100_000, LIMITS) == Cadence(3.0, 15.0)
    tight = Settings(heartbeat_rate_max=100.0, recovery_deadline_s=3.0)
    assert cadence_for(10_000, tight) == base  # no room to grow: the configured cadence


def test_after_the_interval_shrinks_nodes_are_judged_by_the_longer_one_until_every_agent_heard() -> None:
    pace = Pace.start(LIMITS)
    pace.nodes_in_service(4096, 0.0)
    assert pace.told == pace.judged(0.0) == Cadence(3.0, 15.0)
    pace.nodes_in_service(300, 5.0)  # most nodes left
    assert pace.told == Cadence(0.5, 2.5)
    assert pace.judged(5.0 + 3.0 + 15.0 - 0.01) == Cadence(3.0, 15.0)  # a beat and a deadline more
    assert pace.judged(5.0 + 3.0 + 15.0) == Cadence(0.5, 2.5)
    pace.nodes_in_service(4096, 30.0)  # growing takes effect at once (agents beat faster meanwhile)
    assert pace.judged(30.0) == Cadence(3.0, 15.0)
    pace.nodes_in_service(2048, 40.0)  # shrinks, then grows past it within the wider one's time
    pace.nodes_in_service(100_000, 41.0)
    assert pace.judged(41.0) == Cadence(3.0, 15.0)


def test_agents_are_told_the_cadence_and_a_silent_node_is_judged_by_it(make: Any) -> None:
    # A budget of 4 beats a second: 3 nodes beat every 0.75 s, and are lost after 3.75 s.
    cluster = make(nodes=3, heartbeat_rate_max=4.0)
    c = cluster.c
    cluster.step(0.5)
    reply = c.register(Registration(node="n0", slots=2))
    assert (reply.heartbeat_interval_s, reply.heartbeat_deadline_s) == (0.75, 3.75)
    assert c.heartbeat(Heartbeat(node="n0")).heartbeat_interval_s == 0.75
    for _ in range(5):  # every node heard past an agent's request timeout since the start
        cluster.step(0.5)
    cluster.nodes = ("n0", "n1")  # n2 stops
    for _ in range(7):  # 3.5 s: past the configured 2.5 s deadline, within 3.75 s
        cluster.step(0.5)
    assert c.store.node("n2").state is NodeState.HEALTHY
    cluster.step(0.5)
    assert c.store.node("n2").state is NodeState.LOST


def test_an_agents_wait_is_the_interval_give_or_take_a_tenth() -> None:
    waits = [jittered(2.0) for _ in range(1000)]
    assert all(1.8 <= w <= 2.2 for w in waits)
    assert max(waits) - min(waits) > 0.3  # spread: agents that started together drift apart

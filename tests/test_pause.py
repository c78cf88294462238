"""A paused coordinator (SIGSTOP, then SIGCONT) and a request its agent had given up on: stepped
by hand (tests/fakecluster.py), the loop timed by the fake clock too."""

from __future__ import annotations

from typing import Any

from unicron.core.protocol import AGENT_RETRY_CAP_S
from unicron.core.states import NodeState


def test_a_stale_request_read_after_a_stall_does_not_cost_a_backing_off_node(make: Any) -> None:
    """During a 20 s stall n1's agent timed out its requests (2 s each) and backs off (up to
    AGENT_RETRY_CAP_S between tries); the timed-out requests wait in the listen backlog. On
    SIGCONT the overdue tick runs first (the stall is noticed: a fresh deadline from now), then
    the backlog is read: n1's stale request counts as heard, although its agent is still in its
    backoff. n1 must not be lost before that backoff can have ended."""
    cluster = make()
    c, clock = cluster.c, cluster.clock
    c.loop_clock, c.last_tick = clock, None  # the fake clock times the loop too
    for step in range(2, 8):
        cluster.train(step)
        cluster.step(0.5)
    clock.now += 20.0  # stopped: no tick, no request read
    c.tick()  # SIGCONT: the overdue tick first
    resumed = clock.now
    assert cluster.events("coordinator_stalled")
    clock.now += 0.01
    cluster.beat("n0")  # n0's agent's live request, answered
    cluster.beat("n1")  # n1's stale one from the backlog (its agent gave up on it)
    back = resumed + AGENT_RETRY_CAP_S - 0.5  # n1's agent tries again within its backoff's cap
    for tenth in range(1, int((back - resumed) * 10)):
        clock.now = resumed + tenth / 10
        if tenth % 5 == 0:
            cluster.beat("n0")  # n0 heartbeats on
        c.tick()
    lost = [n.name for n in c.store.nodes() if n.state is NodeState.LOST]
    assert lost == [] and cluster.events("node_lost") == [], f"{lost} lost, {cluster.events('node_lost')}"

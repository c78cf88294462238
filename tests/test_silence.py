"""Whose fault a silence is (control/detect/silence.py), as values on hand-built states and a
fake clock: the coordinator's own lateness is not counted against a node, a mass silence
declares nobody lost and raises an alarm, and the losses acted on are rate limited. Then through
the coordinator, stepped by hand (tests/fakecluster.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from unicron.brain.records import NodeRecord
from unicron.control.detect.nodewatch import Holding, silent_nodes
from unicron.control.detect.silence import BeatDelays, Lateness, SilenceJudge
from unicron.core.protocol import Heartbeat
from unicron.core.settings import Settings
from unicron.core.states import NodeState

LIMITS = Settings()  # deadline 2.5 s, mass silence past 0.55 of at least 3, burst 32 at 1/s
DEADLINE = LIMITS.heartbeat_deadline_s


def node(name: str, last_seen: float, state: NodeState = NodeState.HEALTHY) -> NodeRecord:
    return NodeRecord(id=0, name=name, slots=1, gpus=[], host="127.0.0.1", state=state, last_seen=last_seen)


def test_the_longest_lateness_since_a_time_is_looked_up_and_shorter_older_marks_are_dropped() -> None:
    late = Lateness(window_s=60.0)
    for now, late_s in [(10.0, 0.3), (11.0, 0.1), (12.0, 0.8), (13.0, 0.2), (14.0, 0.0)]:
        late.add(now, late_s)
    assert late.times == [12.0, 13.0]  # 0.3 and 0.1 came before a longer one
    assert late.since(9.0) == 0.8 and late.since(12.0) == 0.2 and late.since(13.0) == 0.0
    late.add(100.0, 0.05)
    assert late.times == [100.0] and late.since(0.0) == 0.05  # out of the window: forgotten


def test_a_node_is_not_blamed_for_the_time_the_coordinators_loop_was_late() -> None:
    late = Lateness(window_s=60.0)
    late.add(101.0, 0.9)  # the loop came 0.9 s late to a tick after the node was last heard
    nodes = [node("a", 100.0), node("b", 100.0)]
    assert silent_nodes(nodes, 103.2, 0.0, DEADLINE, late.since) == []  # 3.2 s, 0.9 of them the coordinator's
    assert silent_nodes(nodes, 103.2, 0.0, DEADLINE) != []  # (counted against the nodes before)
    # A node that really stopped is found within the deadline plus the lag.
    (found,) = silent_nodes([node("a", 100.0)], 103.5, 0.0, DEADLINE, late.since)
    assert found[0] == "a" and round(found[1], 3) == 3.5  # its whole silence, as the loss records


def silent(*names: str, for_s: float = 3.0) -> list[tuple[str, float]]:
    return [(name, for_s) for name in names]


def test_a_mass_silence_declares_nobody_lost_until_heartbeats_return_or_it_lasts_too_long() -> None:
    judge = SilenceJudge(LIMITS)
    first = judge.judge(silent("a", "b", "c"), in_service=5, now=10.0)  # 3 of 5: past 0.55
    assert first.lost == [] and first.held == ["a", "b", "c"] and first.alarm_began and first.alarm_holds
    assert judge.judge(silent("a", "b", "c"), 5, 20.0).lost == []
    back = judge.judge(silent("c"), 5, 21.0)  # a and b heard again: the alarm ends
    assert back.alarm_ended == 11.0 and back.lost == []  # (the detector gives c a restart's grace)
    assert judge.judge(silent("c"), 5, 25.0).lost == [("c", 3.0)]  # then c is judged alone
    # All the nodes in service silent is a mass silence however few (the coordinator's network).
    assert judge.judge(silent("x", "y"), 2, 30.0).alarm_began
    held_on = judge.judge(silent("x", "y", for_s=63.0), 2, 30.0 + LIMITS.mass_silence_hold_s)
    assert sorted(held_on.lost) == [("x", 63.0), ("y", 63.0)]  # held as long as allowed: real
    assert held_on.alarm_why == "mass silence" and not held_on.alarm_holds  # (shown as not holding)
    # Fewer than three silent, or not past the share, is not a mass silence.
    assert SilenceJudge(LIMITS).judge(silent("a", "b"), 3, 0.0).lost == silent("a", "b")
    assert SilenceJudge(LIMITS).judge(silent("a", "b", "c"), 6, 0.0).lost == silent("a", "b", "c")


def test_a_silence_rising_across_the_cluster_is_held_before_most_nodes_pass_their_deadline() -> None:
    """Nodes gone quiet together pass their deadline over a sweep or two: the first few past it
    are held when most of the cluster is quiet (unheard for half a deadline), not lost; a rack's
    worth quiet is judged as usual, and in a small cluster one dead node beside one late
    heartbeat is not a mass silence."""
    tide = SilenceJudge(LIMITS).judge(silent(*[f"n{i}" for i in range(30)]), 100, 10.0, quiet=80)
    assert tide.lost == [] and len(tide.held) == 30 and tide.alarm_began and tide.alarm_why == "mass silence"
    rack = SilenceJudge(LIMITS).judge(silent(*[f"n{i}" for i in range(30)]), 100, 10.0, quiet=35)
    assert len(rack.lost) == 30 and not rack.alarm_began
    assert SilenceJudge(LIMITS).judge(silent("a"), 2, 10.0, quiet=2).lost == silent("a")
    assert not SilenceJudge(LIMITS).judge([], 100, 10.0, quiet=100).alarm_began  # none past: no alarm


def test_a_rising_silence_through_the_coordinator_declares_nobody_lost(make: Any) -> None:
    """Six of eight nodes stop beating 0.3 s apart (a switch failing port by port, a swamped
    coordinator): when the first passes its deadline only one or two are past it, five quiet;
    every one is held as the mass silence it becomes, none is lost."""
    cluster = make(nodes=8)
    for _ in range(5):
        cluster.step(0.5)
    beating = [f"n{i}" for i in range(8)]
    while len(beating) > 2:
        beating.pop()
        cluster.nodes = tuple(beating)
        for _ in range(3):
            cluster.step(0.1)
    for _ in range(30):
        cluster.step(0.1)
    assert not cluster.events("node_lost")
    (alarm,) = cluster.events("mass_silence")
    assert alarm["why"] == "mass silence" and alarm["silent"] < 5 <= alarm["quiet"], alarm


def test_a_rising_alarm_that_ends_gives_no_grace_and_a_short_deadline_counts_no_quiet_node(make: Any) -> None:
    """An alarm raised on the quiet count alone ends without a restart's grace (the cluster was
    being heard): a node still silent is judged at once. With a deadline under two heartbeat
    intervals past half of it, a healthy node is quiet between its beats: no quiet count there."""
    judge = SilenceJudge(LIMITS)
    assert judge.judge(silent("a"), 10, 10.0, quiet=7).alarm_began  # one past, seven quiet
    ended = judge.judge(silent("a"), 10, 11.0, quiet=1)  # the others heard again
    assert ended.alarm_ended == 1.0 and not ended.grace and ended.lost == []
    assert judge.judge(silent("a"), 10, 11.5, quiet=1).lost == silent("a")
    counted = SilenceJudge(LIMITS)  # a mass silence by the count past the deadline keeps its grace
    assert counted.judge(silent("a", "b", "c", "d"), 5, 10.0, quiet=4).alarm_began
    assert counted.judge(silent("a"), 5, 11.0, quiet=1).grace

    cluster = make(nodes=5, heartbeat_interval_s=1.0, heartbeat_deadline_s=1.5)
    for _ in range(10):
        cluster.step(0.5)
    cluster.nodes = ("n0", "n1", "n2", "n3")  # n4 dies; the others beat every second, together
    for _ in range(4):
        cluster.clock.now += 0.9
        cluster.c.tick()  # every node unheard for 0.9 s: more than half the deadline
        cluster.step(0.1)
    assert cluster.c.store.node("n4").state is NodeState.LOST  # type: ignore[union-attr]
    assert not cluster.events("mass_silence")


def test_the_losses_acted_on_are_rate_limited() -> None:
    judge = SilenceJudge(LIMITS)
    names = [f"n{i:03d}" for i in range(40)]
    first = judge.judge([(n, 3.0 + i) for i, n in enumerate(names)], in_service=100, now=0.0)
    assert len(first.lost) == LIMITS.node_loss_burst and len(first.held) == 8
    assert first.lost[0][0] == "n039"  # the longest silent first
    assert len(judge.judge(silent(*first.held), 100, 0.5).lost) == 0  # half a token
    assert len(judge.judge(silent(*first.held), 100, 3.0).lost) == 3  # one a second


def test_the_coordinators_lateness_costs_no_node_and_a_stopped_node_is_found_after_it(make: Any) -> None:
    cluster = make(nodes=3)
    for _ in range(5):  # every node heard past an agent's request timeout since the start
        cluster.step(0.5)
    for _ in range(3):  # the loop is busy: each tick comes 0.8 s late, no heartbeat read meanwhile
        cluster.clock.now += 0.9
        cluster.c.tick(late_s=0.8)
    assert not cluster.events("node_lost")  # 2.7 s unheard, 0.8 s of it waiting in the sockets
    assert not cluster.events("mass_silence")  # (the lateness, not the alarm, kept them)
    assert cluster.c.viewer.view().late_s == 0.8  # what operators see (the metrics' gauge)
    assert b"unicron_coordinator_late_seconds 0.8" in cluster.c.metrics.exposition()
    for _ in range(3):
        cluster.step(0.5)
    cluster.nodes = ("n0", "n1")  # n2 stops
    for _ in range(5):
        cluster.step(0.5)
    assert cluster.c.store.node("n2").state is NodeState.HEALTHY  # type: ignore[union-attr]
    cluster.step(0.5)
    assert cluster.c.store.node("n2").state is NodeState.LOST  # type: ignore[union-attr]
    (lost,) = cluster.events("node_lost")  # its silence, the lateness not counted, the deadline
    assert lost["silent_s"] > DEADLINE and lost["deadline_s"] == DEADLINE
    assert lost["late_s"] == 0.0  # (the loop was late before n2 was last heard)


def test_a_mass_silence_through_the_coordinator_raises_an_alarm_and_takes_nobody_out(make: Any) -> None:
    cluster = make(nodes=4)
    for _ in range(5):
        cluster.step(0.5)
    cluster.nodes = ("n0",)  # three of four fall silent at once (a switch, not three nodes)
    for _ in range(10):
        cluster.step(0.5)
    assert not cluster.events("node_lost")
    (alarm,) = cluster.events("mass_silence")
    assert alarm["silent"] == 3 and alarm["in_service"] == 4
    (held,) = cluster.events("node_loss_held")  # one event for all of them, each named once
    assert held["nodes"] == ["n1", "n2", "n3"] and held["count"] == 3 and held["why"] == "mass silence"
    # What operators are shown (the metrics, `unicron status` through /v1/node-losses).
    assert cluster.c.nodes.holding() == Holding(by_hand=False, alarm="mass silence", domains=(), nodes=3)
    shown = cluster.c.metrics.exposition()
    assert b"unicron_mass_silence 1.0" in shown and b"unicron_node_losses_held_now 3.0" in shown
    cluster.nodes = ("n0", "n1", "n2", "n3")  # the switch is back
    cluster.step(0.5)
    assert cluster.c.nodes.holding() == Holding(by_hand=False, alarm=None, domains=(), nodes=0)
    (over,) = cluster.events("mass_silence_over")
    assert over["silent"] == 0 and cluster.c.store.get_task("lm").generation == 1  # undisturbed


def test_heartbeats_that_waited_in_the_coordinators_sockets_say_how_far_behind_it_is() -> None:
    delays = BeatDelays(cap_s=2.5, window_s=2.5)
    nodes = {f"n{i}": 0.01 * i for i in range(10)}  # each one's network floor
    nodes["n9"] = -5.0  # n9's clock is 5 s ahead: its floor holds it
    for node, floor in nodes.items():  # a node's first heartbeat sets its floor only
        delays.heard(node, floor, unanswered_s=300.0, now=0.0)  # (an agent that waited for a start)
    assert delays.lag(0.0) == 0.0
    for node, floor in nodes.items():  # the coordinator falls behind: each waited 1.2 s
        delays.heard(node, floor + 1.2, 0.0, 2.0)
    assert abs(delays.lag(2.0) - 1.2) < 1e-9
    for node, floor in nodes.items():  # caught up
        delays.heard(node, floor, 0.0, 3.0)
    # One node cannot set the lag: its token's lie, or its clock stepped back a minute.
    delays.heard("n3", 0.03, unanswered_s=1e6, now=3.1)
    assert delays.lag(3.1) == 0.0
    delays.heard("n3", 0.03, 0.0, 3.2)
    delays.heard("n4", 0.04 + 60.0, 0.0, 3.2)
    assert delays.lag(3.2) == 0.0
    # Nor can many hide a dead node for long: each wait counts at most the cap.
    for node, floor in nodes.items():
        delays.heard(node, floor, unanswered_s=1e6, now=4.0)
    assert delays.lag(4.0) == 2.5
    assert delays.lag(7.0) == 0.0  # (and only while it is recent)


def backlogged(make: Any, nodes: int) -> tuple[Any, Callable[[str, float], None]]:
    """A cluster of ``nodes`` settled, and ``read(node, waited_s)``: a heartbeat of ``node``
    read now that was sent ``waited_s`` before (it waited in the coordinator's sockets)."""
    cluster = make(nodes=nodes)
    for _ in range(5):
        cluster.step(0.5)

    def read(node: str, waited_s: float) -> None:
        sent = cluster.clock.now - waited_s
        cluster.c.heartbeat(Heartbeat(node=node, acked=cluster.acked.get(node, 0), sent=sent))

    for node in cluster.nodes:
        read(node, 0.01)  # each node's delay on an idle coordinator
    return cluster, read


def test_a_coordinator_whose_heartbeats_wait_in_its_sockets_loses_no_node(make: Any) -> None:
    """Its loop ticks on time, but the heartbeats it reads were sent 2 s before: a backlog, in
    which one node's are not read for 3 s. Its silence is the coordinator's."""
    cluster, read = backlogged(make, 3)
    for _ in range(6):
        cluster.clock.now += 0.5
        read("n0", 2.0)
        read("n1", 2.0)
        cluster.c.tick()
    assert not cluster.events("node_lost")  # n2 unheard for 3 s, the coordinator 2 s behind
    while not cluster.events("node_lost"):  # the backlog is gone; n2 stays silent
        assert cluster.clock.now < 1_000_100, "n2 never found lost"
        cluster.clock.now += 0.1
        read("n0", 0.01)
        read("n1", 0.01)
        cluster.c.tick()
    (lost,) = cluster.events("node_lost")  # within the deadline plus the coordinator's lag
    assert DEADLINE + 2.0 <= lost["silent_s"] <= DEADLINE + 2.0 + 0.11


def test_an_admins_hold_declares_no_loss_until_released() -> None:
    judge = SilenceJudge(LIMITS, by_hand=True)
    held = judge.judge(silent("a"), in_service=10, now=0.0)
    assert held.lost == [] and held.held == ["a"]
    judge.by_hand = False
    assert judge.judge(silent("a"), 10, 1.0).lost == silent("a")


def test_a_node_still_backing_off_when_a_mass_silence_ends_gets_a_restarts_grace(make: Any) -> None:
    cluster = make(nodes=4)
    for _ in range(5):
        cluster.step(0.5)
    cluster.nodes = ("n0",)  # the coordinator's link goes for 5 s
    for _ in range(10):
        cluster.step(0.5)
    cluster.nodes = ("n0", "n1", "n2")  # two agents are back first; n3's is in its retry pause
    cluster.step(0.5)
    assert cluster.events("mass_silence_over") and not cluster.events("node_lost")
    for _ in range(6):
        cluster.step(0.5)
    assert not cluster.events("node_lost")  # within an agent's longest retry pause + a deadline
    for _ in range(30):
        cluster.step(0.5)
    assert len(cluster.events("node_lost")) == 1  # a node that does not come back is lost in the end


RACKS = {**{f"a{i}": "rack-a" for i in range(4)}, **{f"b{i}": "rack-b" for i in range(4)}}


def test_a_domain_partly_silent_is_held_and_a_whole_one_is_judged() -> None:
    judge = SilenceJudge(LIMITS)
    partly = judge.judge(silent("b1", "b2", "b3"), 8, 10.0, RACKS, grace_s=5.0)  # 3 of 4: past 0.55
    assert partly.lost == [] and sorted(partly.held) == ["b1", "b2", "b3"]
    assert partly.domains_began == (("rack-b", 3, 4),) and not partly.alarm_began  # 3 of 8: no mass
    assert judge.judge(silent("b1", "b2", "b3"), 8, 20.0, RACKS).lost == []
    back = judge.judge(silent("b3"), 8, 21.0, RACKS, grace_s=5.0)  # b1, b2 heard: the alarm ends
    assert back.domains_ended == (("rack-b", 11.0),) and back.lost == [] and back.held == ["b3"]
    assert judge.judge(silent("b3"), 8, 25.9, RACKS).lost == []  # a restart's grace
    assert judge.judge(silent("b3"), 8, 26.0, RACKS).lost == silent("b3")  # then judged alone
    # A whole domain silent while the rest beat: its switch or its power, a real outage (also
    # when three of its nodes passed their deadline a moment before the fourth).
    whole = SilenceJudge(LIMITS).judge(silent("b0", "b1", "b2", "b3"), 8, 0.0, RACKS)
    assert sorted(name for name, _ in whole.lost) == ["b0", "b1", "b2", "b3"] and not whole.domains_began
    judge = SilenceJudge(LIMITS)
    assert judge.judge(silent("b0", "b1", "b2"), 8, 0.0, RACKS, grace_s=5.0).domains_began
    all_of_it = judge.judge(silent("b0", "b1", "b2", "b3"), 8, 0.1, RACKS, grace_s=5.0)
    assert len(all_of_it.lost) == 4 and all_of_it.domains_ended == (("rack-b", 0.1),)
    # Partly silent for longer than the hold: taken as real, judged one by one; once they are
    # lost the alarm ends, with no grace for the rest (they were not heard).
    judge = SilenceJudge(LIMITS)
    judge.judge(silent("a0", "a1", "a2"), 8, 0.0, RACKS)
    late = judge.judge(silent("a0", "a1", "a2", for_s=33.0), 8, LIMITS.mass_silence_hold_s, RACKS)
    assert sorted(name for name, _ in late.lost) == ["a0", "a1", "a2"]
    after = judge.judge([], 7, LIMITS.mass_silence_hold_s + 1.0, {"a3": "rack-a"}, grace_s=5.0)
    assert after.domains_ended and not judge.domain_grace
    # Nodes that named no domain are judged as before.
    assert SilenceJudge(LIMITS).judge(silent("x", "y"), 8, 0.0, RACKS).lost == silent("x", "y")


def test_a_rack_partly_silent_through_the_coordinator_is_held_with_its_alarm(make: Any) -> None:
    names = ("a0", "a1", "a2", "a3", "b0", "b1", "b2", "b3")
    cluster = make(nodes=8, domains={f"n{i}": RACKS[name] for i, name in enumerate(names)})
    assert cluster.c.store.node("n4").domain == "rack-b"  # type: ignore[union-attr]
    for _ in range(5):
        cluster.step(0.5)
    cluster.nodes = ("n0", "n1", "n2", "n3", "n4")  # rack b's switch drops three of its four
    for _ in range(10):
        cluster.step(0.5)
    assert not cluster.events("node_lost") and not cluster.events("mass_silence")
    (alarm,) = cluster.events("domain_silence")
    assert (alarm["domain"], alarm["silent"], alarm["in_service"]) == ("rack-b", 3, 4)
    (held,) = cluster.events("node_loss_held")
    assert held["why"] == "domain silence" and held["domains"] == ["rack-b"] and held["count"] == 3
    assert b'unicron_domain_silence{domain="rack-b"} 1.0' in cluster.c.metrics.exposition()
    assert cluster.c.nodes.holding() == Holding(by_hand=False, alarm=None, domains=("rack-b",), nodes=3)
    cluster.nodes = tuple(f"n{i}" for i in range(8))  # the switch is back
    cluster.step(0.5)
    assert cluster.events("domain_silence_over") and not cluster.events("node_lost")
    assert b'unicron_domain_silence{domain="rack-b"} 0.0' in cluster.c.metrics.exposition()
    for _ in range(40):  # (past the grace the rack's nodes got when it was heard again)
        cluster.step(0.5)
    cluster.nodes = ("n0", "n1", "n2", "n3")  # now the whole rack goes: its power
    for _ in range(8):
        cluster.step(0.5)
    states = {cluster.c.store.node(f"n{i}").state for i in range(4, 8)}  # type: ignore[union-attr]
    assert states == {NodeState.LOST} and len(cluster.events("domain_silence")) == 1


def test_a_coordinator_far_behind_holds_every_loss_and_says_why() -> None:
    judge = SilenceJudge(LIMITS)
    held = judge.judge(silent("a"), 10, 0.0, behind=True)  # one of ten: no mass silence
    assert held.lost == [] and held.held == ["a"] and held.alarm_began
    assert held.alarm_why == "coordinator behind"
    assert judge.judge(silent("a"), 10, 1.0, behind=False).alarm_ended == 1.0  # caught up
    assert judge.judge(silent("a"), 10, 2.0).lost == silent("a")
    assert SilenceJudge(LIMITS).judge([], 10, 0.0, behind=True).alarm_began is False  # nobody silent


def test_heartbeats_waiting_a_whole_deadline_hold_the_losses_until_the_coordinator_caught_up(
    make: Any,
) -> None:
    """A backlog so long that the beats read waited a deadline or more (the lag's cap): n2's are
    not read at all for 6 s. Held as the coordinator's own fault, then found once it caught up."""
    cluster, read = backlogged(make, 4)
    for _ in range(12):
        cluster.clock.now += 0.5
        for node in ("n0", "n1", "n3"):
            read(node, 4.0)
        cluster.c.tick()
    assert not cluster.events("node_lost")
    (alarm,) = cluster.events("mass_silence")
    assert alarm["why"] == "coordinator behind" and alarm["lag_s"] == DEADLINE
    (held,) = cluster.events("node_loss_held")
    assert held["why"] == "coordinator behind" and held["nodes"] == ["n2"]
    for _ in range(12):  # still 1.5 s behind (over half a deadline): not caught up yet
        cluster.clock.now += 0.5
        for node in ("n0", "n1", "n3"):
            read(node, 1.5)
        cluster.c.tick()
    assert not cluster.events("node_lost") and not cluster.events("mass_silence_over")
    while not cluster.events("node_lost"):  # caught up; n2 stays silent
        assert cluster.clock.now < 1_000_100, "n2 never found lost"
        cluster.clock.now += 0.1
        for node in ("n0", "n1", "n3"):
            read(node, 0.01)
        cluster.c.tick()
    assert len(cluster.events("mass_silence_over")) == 1 and len(cluster.events("mass_silence")) == 1

"""The peer probe behind a hang no rank can be blamed for: the verdict (pure, hand-built reports)
and the probe itself (real sockets on loopback)."""

from __future__ import annotations

import asyncio
import socket

from unicron.control.agent.peerprobe import listen, reachable, unreachable
from unicron.control.detect.peercheck import STUCK, PeerCheck, outcome, partition_verdict
from unicron.core.taxonomy import TAXONOMY, ErrorKind
from unicron.core.tiers import Tier

NODES = {"a", "b", "c", "d", "e"}


def test_the_node_its_peers_cannot_reach_is_the_culprit() -> None:
    reports = {"a": ["e"], "b": ["e"], "c": ["e"], "d": ["e"], "e": ["a", "b", "c", "d"]}
    verdict = partition_verdict(reports, NODES)
    assert verdict.culprits == ("e",) and "e cut off from peers" in verdict.why
    # It is found from the others' reports alone, when its own did not come.
    assert partition_verdict({k: v for k, v in reports.items() if k != "e"}, NODES).culprits == ("e",)


def test_two_cut_off_nodes_are_both_taken_and_a_tie_blames_no_one() -> None:
    reports = {"a": ["d", "e"], "b": ["d", "e"], "c": ["d", "e"], "d": ["a", "b", "c"], "e": ["a", "b", "c"]}
    assert set(partition_verdict(reports, NODES).culprits) == {"d", "e"}
    halves = {"a": ["c", "d"], "b": ["c", "d"], "c": ["a", "b"], "d": ["a", "b"]}
    assert partition_verdict(halves, {"a", "b", "c", "d"}).culprits == ()  # either side could be cut off
    three_two = {"a": ["d", "e"], "b": ["d", "e"], "c": ["d", "e"]}
    assert partition_verdict(three_two, NODES).culprits == ("d", "e")  # the smaller side goes
    assert partition_verdict({"a": ["b"], "b": ["a"]}, {"a", "b"}).culprits == ()


def test_a_whole_network_blames_no_node() -> None:
    verdict = partition_verdict({n: [] for n in NODES}, NODES)
    assert verdict.culprits == () and "not the network" in verdict.why
    assert partition_verdict({"a": ["zz"]}, NODES).culprits == ()  # a name outside the generation


def test_the_probe_reaches_a_listener_and_not_a_closed_port() -> None:
    async def probe() -> list[str]:
        server = await listen("127.0.0.1")
        port = server.sockets[0].getsockname()[1]
        with socket.socket() as closed:
            closed.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
            gone = closed.getsockname()[1]
            found = await unreachable({"up": f"127.0.0.1:{port}", "down": f"127.0.0.1:{gone}"}, 1.0)
        server.close()
        return found

    assert asyncio.run(probe()) == ["down"]


def test_the_probe_keeps_trying_until_its_time_is_up() -> None:
    """A handshake lost now and then (a lossy link) makes one attempt fail: new attempts start
    every STAGGER_S until one succeeds. Here the listener opens only after a second: attempts
    refused before it, one after it connects."""

    async def probe() -> tuple[bool, float]:
        with socket.socket() as late:
            late.bind(("127.0.0.1", 0))
            port = late.getsockname()[1]
            began = asyncio.get_running_loop().time()
            asyncio.get_running_loop().call_later(1.0, late.listen)
            found = await reachable(f"127.0.0.1:{port}", 3.0)
            return found, asyncio.get_running_loop().time() - began

    found, took = asyncio.run(probe())
    assert found and took >= 1.0


def check(unreachable: dict[str, list[str]]) -> PeerCheck:
    ranks = {"a": {0, 1}, "b": {2, 3}, "c": {4, 5}}
    return PeerCheck("lm", 3, 12, 100.0, "every rank waits", 105.0, ranks, unreachable)


def test_a_complete_check_takes_out_the_cut_off_node_with_its_ranks() -> None:
    decided = outcome(check({"a": ["c"], "b": ["c"], "c": ["a", "b"]}), 10.0)
    assert (decided.kind, decided.node, decided.failed, decided.grace_s) == (
        ErrorKind.NODE_PARTITIONED, "c", frozenset({4, 5}), 0.0,
    )  # fmt: skip


def test_a_whole_network_gets_the_grace_once_every_node_answered() -> None:
    whole = outcome(check({"a": [], "b": [], "c": []}), 10.0)
    assert whole.grace_s == 10.0  # slow, not broken: no incident yet
    unanswered = outcome(check({"a": [], "b": []}), 10.0)  # c's answer never came
    assert (unanswered.grace_s, unanswered.kind, unanswered.failed) == (0.0, ErrorKind.TASK_HANG, None)
    tie = outcome(check({"a": ["b"], "b": ["a"], "c": []}), 10.0)  # a and b: either could be cut off
    assert (tie.grace_s, tie.kind, tie.failed) == (0.0, ErrorKind.TASK_HANG, None)
    # With the grace turned off, a whole network's stall is stuck: every rank alive, none to
    # blame, no node: the cheapest tier (a reattempt in place) is asked for.
    stuck = outcome(check({"a": [], "b": [], "c": []}), 0.0)
    assert (stuck.grace_s, stuck.kind, stuck.failed, stuck.node) == (0.0, STUCK, frozenset(), None)
    assert TAXONOMY[STUCK].tier is Tier.REATTEMPT

"""Sharded replicas in the control plane (issue 14, first part): a task of ``run.replica_size``
ranks per replica is planned, placed and recovered in whole replicas. Pure checks on hand-built
specs, placements and snapshots; tests/test_live_replicas.py runs it through the real stack."""

from __future__ import annotations

from typing import Any

import pytest

from unicron.brain.effects import StopWorker, Switch
from unicron.brain.membership import planned_shrink, survivors, whole_replicas
from unicron.brain.response import Failure, respond
from unicron.core.errors import Conflict, SpecError
from unicron.core.livespecs import parse_live_tasks, replica_misfit
from unicron.core.tiers import Tier
from unicron.planning.placement import place

from .test_response import LIMITS, NOW, decision, snapshot, worker

SPEC = (
    "name: lm\nweight: 1\nthroughput: {{{counts}}}\n{extra}"
    "run: {{program: [x], iterations: 3, replica_size: 2}}\n"
)


def even(size: int) -> bool:
    return size > 0 and size % 2 == 0


def test_a_replica_size_makes_only_whole_replicas_usable() -> None:
    (spec,) = parse_live_tasks(SPEC.format(counts="2: 1.0e9, 4: 2.0e9, 6: 2.5e9", extra=""))
    assert [c for c in range(1, 8) if spec.is_usable(c)] == [2, 4, 6]
    assert spec.replica_size == 2 and spec.step == 2


@pytest.mark.parametrize(
    ("counts", "extra", "says"),
    [
        ("2: 1.0e9, 3: 1.5e9", "", "throughput 3 is not a whole number of replicas of run.replica_size 2"),
        ("2: 1.0e9, 4: 2.0e9", "min_workers: 3\n", "min_workers 3 is not a multiple of run.replica_size 2"),
        ("2: 1.0e9, 4: 2.0e9", "max_workers: 3\n", "max_workers 3 is not a whole number of replicas"),
    ],
)
def test_counts_that_split_a_replica_are_refused_with_the_fix(counts: str, extra: str, says: str) -> None:
    with pytest.raises(SpecError) as refused:
        parse_live_tasks(SPEC.format(counts=counts, extra=extra))
    assert says in str(refused.value) and "use" in str(refused.value)


def test_a_replica_must_fill_nodes_evenly_or_span_whole_ones() -> None:
    (spec,) = parse_live_tasks(SPEC.format(counts="2: 1.0e9", extra=""))
    assert replica_misfit(spec, 4) is None and replica_misfit(spec, 1) is None  # 2 of 4, 2 nodes of 1
    assert "neither divides nor spans whole nodes of 3 slots" in (replica_misfit(spec, 3) or "")


def test_whole_replicas_go_to_a_node_and_scattered_slots_are_packed_afresh() -> None:
    # One rank of "dp" on each node leaves no node with two free slots: "lm" (replicas of 2)
    # would be split; the cluster is packed afresh instead.
    layout = place({"dp": 2, "lm": 2}, [0, 1], 2, {0: {"dp": 1}, 1: {"dp": 1}}, {"lm": 2})
    assert sorted(layout[n].get("lm", 0) for n in layout) == [0, 2]
    assert sum(per.get("dp", 0) for per in layout.values()) == 2
    # Without replicas the workers stay where they are.
    assert place({"dp": 2, "lm": 2}, [0, 1], 2, {0: {"dp": 1}, 1: {"dp": 1}}) == {
        0: {"dp": 1, "lm": 1},
        1: {"dp": 1, "lm": 1},
    }
    # A replica of 4 on nodes of 2 spans whole nodes.
    spans = place({"lm": 4, "dp": 1}, [0, 1, 2], 2, {}, {"lm": 4})
    assert sorted(per.get("lm", 0) for per in spans.values()) == [0, 2, 2]


def test_a_failed_rank_takes_its_whole_replica_out_and_the_others_go_on() -> None:
    """Ranks 0-1 (node a) and 2-3 (node b) are two replicas of 2: rank 1 dies, rank 0 leaves
    with it (not stopped: it exits when it finds itself in no membership), 2-3 go on."""
    failure = Failure("lm", "a", "rank 1 died", frozenset({1}))
    response = respond(snapshot(), failure, decision(), True, even, LIMITS, NOW, replica_size=2)
    assert response.tier is Tier.RESTART_FAILED
    (switch,) = [e for e in response.effects if isinstance(e, Switch)]
    assert switch.membership.ranks == {2: 0, 3: 1} and switch.membership.failed == [1]
    assert [e.worker.rank for e in response.effects if isinstance(e, StopWorker)] == [1]
    # The same failure without replicas keeps rank 0 (and an even count: 0 and 2).
    plain = respond(snapshot(), failure, decision(), True, even, LIMITS, NOW)
    (switch,) = [e for e in plain.effects if isinstance(e, Switch)]
    assert switch.membership.ranks == {0: 0, 2: 1}


def test_only_the_members_of_whole_replicas_are_kept_in_their_order() -> None:
    """Replicas of 2: ranks 0-1, 2-3, 4-5; whatever order the members come in."""
    members = [worker(r, "a") for r in (5, 0, 2, 1, 3)]  # (replica 2 lacks rank 4)
    assert [w.rank for w in whole_replicas(members, 2)] == [0, 2, 1, 3]
    whole = [worker(r, "a") for r in (3, 2, 1, 0)]
    assert whole_replicas(whole, 2) == whole and whole_replicas(whole, 2) is not whole
    assert whole_replicas(members, 1) == members and whole_replicas([], 4) == []


def test_no_whole_replica_left_is_no_recovery_in_place() -> None:
    live = [worker(r, "a" if r < 2 else "b") for r in range(4)]
    assert isinstance(survivors(live, {1, 2}, {"a", "b"}, even, 6, replica_size=2), str)


def test_a_planned_shrink_keeps_whole_replicas() -> None:
    """Replicas of 4 spanning nodes a-b and c-d: the plan keeps 2 slots on b and 2 on c, which
    is 4 workers but no whole replica: no shrink in place."""
    live = [worker(r, "abcd"[r // 2]) for r in range(8)]
    assert planned_shrink(live, {"b": 2, "c": 2}, lambda n: n % 4 == 0, 6, replica_size=4) is None
    kept = planned_shrink(live, {"c": 2, "d": 2}, lambda n: n % 4 == 0, 6, replica_size=4)
    assert kept is not None and kept.membership.ranks == {4: 0, 5: 1, 6: 2, 7: 3}


def test_a_submission_whose_replicas_cannot_fill_the_nodes_is_refused_whole(make: Any) -> None:
    cluster = make()  # nodes of 2 slots, task lm running
    specs = parse_live_tasks(
        "tasks:\n"
        "  - {name: ok, weight: 1, throughput: {2: 1.0e9}, run: {program: [x], iterations: 3}}\n"
        "  - {name: odd, weight: 1, throughput: {3: 1.0e9},\n"
        "     run: {program: [x], iterations: 3, replica_size: 3}}\n"
    )
    with pytest.raises(Conflict, match="replica_size 3 neither divides nor spans whole nodes of 2 slots"):
        cluster.c.submit(*specs)
    assert cluster.c.store.task("ok") is None and cluster.c.store.task("odd") is None

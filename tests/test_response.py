"""The coordinator's pure deciders on hand-built snapshots (no store, no processes, no clock):
which effects each ladder decision has on the cluster as the snapshot shows it, and how the
plan moves each task (in place or by a restart)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from unicron.brain.effects import Isolate, StopGeneration, StopWorker, Switch, TaskDown
from unicron.brain.records import NodeRecord, TaskRecord, WorkerRecord, drained_across
from unicron.brain.response import Failure, Stalled, escalate, in_place, regrouped, respond
from unicron.brain.snapshot import Snapshot
from unicron.control.place.draining import returning_state
from unicron.control.place.moves import Move, MoveKind, move_for
from unicron.core.ladder import Decision
from unicron.core.settings import Settings
from unicron.core.states import NodeState, TaskState, WorkerPhase
from unicron.core.taxonomy import ErrorKind, Scope, Severity
from unicron.core.tiers import Escalation, Tier

NOW = 5_000.0
LIMITS = Settings()


def task(generation: int = 3) -> TaskRecord:
    return TaskRecord(
        name="lm", spec="{}", state=TaskState.RUNNING, generation=generation, workers=4, step=40,
        checkpoint_step=30, store_port=1234, failures=0, restarts=0, down_since=None, downtime_s=0.0,
        samples=0, flop=0.0, digest=None, submitted=0.0, started=1.0, finished=None, reason=None,
        launched_generation=1, redo_until=0,
    )  # fmt: skip


def node(name: str, state: NodeState = NodeState.HEALTHY) -> NodeRecord:
    return NodeRecord(id=0, name=name, slots=2, gpus=[], host="127.0.0.1", state=state, last_seen=NOW)


def worker(rank: int, node_name: str, generation: int = 3) -> WorkerRecord:
    return WorkerRecord(
        "lm", generation, rank, node_name, rank % 2, WorkerPhase.RUNNING, 100 + rank, None, None, 0.0
    )


def snapshot(a_state: NodeState = NodeState.HEALTHY) -> Snapshot:
    """Task lm, generation 3: ranks 0, 1 on node a and 2, 3 on node b; generation 5 was used by
    a cancelled grow, so the next one is 6."""
    members = tuple(worker(r, "a" if r < 2 else "b") for r in range(4))
    return Snapshot(
        tasks={"lm": task()},
        nodes={"a": node("a", a_state), "b": node("b")},
        members={"lm": members},
        next_generation={"lm": 6},
    )


def decision(
    tier: Tier = Tier.RESTART_FAILED, isolate: bool = False, kind: ErrorKind = ErrorKind.EXITED_ABNORMALLY
) -> Decision:
    return Decision(kind, Severity.SEV2, tier, isolate, "test", Scope.WORKER)


def even(size: int) -> bool:
    return size % 2 == 0


def anything(size: int) -> bool:
    return size > 0


def failure(failed: set[int] | None, node: str | None = "a") -> Failure:
    return Failure("lm", node, "rank 1 died", None if failed is None else frozenset(failed))


RESTART = (StopGeneration("lm", 3, LIMITS.failure_stop_grace_s), TaskDown("lm", TaskState.RESTARTING))


def test_a_reattempt_re_forms_every_member_and_stops_nobody() -> None:
    response = respond(snapshot(), failure(set()), decision(Tier.REATTEMPT), True, anything, LIMITS, NOW)
    assert (response.tier, response.escalations) == (Tier.REATTEMPT, ())
    (switch,) = [e for e in response.effects if isinstance(e, Switch)]
    assert switch.membership.ranks == {0: 0, 1: 1, 2: 2, 3: 3} and switch.membership.generation == 6
    # Nobody failed, and still every member leaves the step in progress (a stuck collective).
    assert switch.membership.failed == [] and switch.membership.abandon
    assert not any(isinstance(e, (StopWorker, StopGeneration, Isolate)) for e in response.effects)


def test_a_reattempt_asked_for_with_a_rank_gone_restarts_the_failed_one_and_says_why() -> None:
    response = respond(snapshot(), failure({1}), decision(Tier.REATTEMPT), True, anything, LIMITS, NOW)
    assert response.tier is Tier.RESTART_FAILED
    (passed,) = response.escalations
    assert (passed.from_tier, passed.to_tier) == (Tier.REATTEMPT, Tier.RESTART_FAILED)
    assert "rank(s) [1] are gone" in passed.why
    assert [e.worker.rank for e in response.effects if isinstance(e, StopWorker)] == [1]


def test_restart_failed_stops_only_the_failed_rank_and_the_survivors_go_on() -> None:
    response = respond(snapshot(), failure({1}), decision(), True, anything, LIMITS, NOW)
    assert (response.tier, response.escalations) == (Tier.RESTART_FAILED, ())
    stops = [e for e in response.effects if isinstance(e, StopWorker)]
    assert [s.worker.rank for s in stops] == [1]
    (switch,) = [e for e in response.effects if isinstance(e, Switch)]
    assert switch.old == 3 and switch.membership.generation == 6
    assert switch.membership.ranks == {0: 0, 2: 1, 3: 2}  # survivors renumbered, lowest first
    assert switch.membership.failed == [1]
    assert TaskDown("lm", TaskState.STARTING) in response.effects
    assert not any(isinstance(e, (StopGeneration, Isolate)) for e in response.effects)
    assert regrouped(response.effects) == {
        "generation": 6,
        "workers": 3,
        "failed": [1],
        "survivors": [0, 2, 3],
    }


def test_restart_failed_with_every_rank_alive_is_not_a_restart() -> None:
    """Nothing failed to restart (a connection broke): the node where it was seen leaves."""
    response = respond(snapshot(), failure(set()), decision(), True, anything, LIMITS, NOW)
    assert response.tier is Tier.RECONFIGURE
    assert "every process is alive" in response.escalations[0].why


def test_reconfigure_takes_the_node_out_and_its_ranks_leave_with_it() -> None:
    response = respond(snapshot(), failure({1}), decision(Tier.RECONFIGURE), True, anything, LIMITS, NOW)
    assert (response.tier, response.escalations) == (Tier.RECONFIGURE, ())
    isolate = response.effects[0]
    assert isinstance(isolate, Isolate) and isolate.node == "a"
    assert isolate.until == NOW + LIMITS.isolation_s
    (switch,) = [e for e in response.effects if isinstance(e, Switch)]
    assert sorted(switch.membership.ranks) == [2, 3]  # rank 0 was on the node that left
    assert switch.membership.failed == [0, 1]
    # The node's processes are stopped by the isolation, not one by one.
    assert not any(isinstance(e, StopWorker) for e in response.effects)


def test_a_device_that_computed_wrong_values_stays_out_until_an_operator_resumes_it() -> None:
    """Isolated with no end (``until`` None), whether the ladder isolates it or the tier takes it
    out: waiting mends no such device. A node of any other kind comes back after isolation_s."""
    sdc = ErrorKind.SILENT_DATA_CORRUPTION
    for asked in (decision(Tier.RECONFIGURE, kind=sdc), decision(Tier.RECONFIGURE, isolate=True, kind=sdc)):
        response = respond(snapshot(), failure({1}), asked, True, anything, LIMITS, NOW)
        (isolate,) = [e for e in response.effects if isinstance(e, Isolate)]
        assert (isolate.node, isolate.until) == ("a", None)
    ecc = decision(Tier.RECONFIGURE, isolate=True, kind=ErrorKind.ECC_ERROR)
    (isolate,) = [e for e in respond(snapshot(), failure({1}), ecc, True, anything, LIMITS, NOW).effects
                  if isinstance(e, Isolate)]  # fmt: skip
    assert isolate.until == NOW + LIMITS.isolation_s


def test_reconfigure_with_no_node_to_blame_restarts_from_the_checkpoint() -> None:
    response = respond(
        snapshot(), failure({1}, node=None), decision(Tier.RECONFIGURE), True, anything, LIMITS, NOW
    )
    assert response.tier is Tier.FROM_CHECKPOINT and response.effects == RESTART
    assert response.escalations == (
        Escalation(
            Tier.RECONFIGURE, Tier.FROM_CHECKPOINT, "no node is to blame, so none can leave the cluster"
        ),
    )


def test_a_node_the_ladder_isolates_is_isolated_whatever_tier_is_carried_out() -> None:
    response = respond(
        snapshot(), failure(None), decision(Tier.RECONFIGURE, isolate=True), True, anything, LIMITS, NOW
    )
    assert response.tier is Tier.FROM_CHECKPOINT
    assert isinstance(response.effects[0], Isolate) and response.effects[1:] == RESTART


def test_no_usable_size_of_survivors_restarts_from_the_checkpoint_and_says_why() -> None:
    three = respond(snapshot(), failure({3}, "b"), decision(), True, even, LIMITS, NOW)  # 3 survivors: 2 kept
    assert three.tier is Tier.RESTART_FAILED
    response = respond(
        snapshot(NodeState.LOST), failure({3}, "b"), decision(), True, even, LIMITS, NOW
    )  # 1 left
    assert response.tier is Tier.FROM_CHECKPOINT and response.effects == RESTART
    assert [(e.from_tier, e.to_tier) for e in response.escalations] == [
        (Tier.RESTART_FAILED, Tier.RECONFIGURE),
        (Tier.RECONFIGURE, Tier.FROM_CHECKPOINT),
    ]
    assert all("no usable size" in e.why for e in response.escalations)


def test_survivors_that_joined_and_never_took_the_state_restart_from_the_checkpoint() -> None:
    """Rank 0 alone held the state; a grow let ranks 1-3 in, and they take it from rank 0 as the
    generation trains its first step. Rank 0 fails first: going on in place, they would train
    on from their checkpoint with nothing recorded lost (seen in a soak: 18 steps trained again
    as an in-place recovery). With rank 0 alive, they take it from rank 0 as before."""
    newcomers = tuple(replace(w, joining=True) for w in snapshot().live("lm")[1:])
    grown = replace(snapshot(), members={"lm": (snapshot().live("lm")[0], *newcomers)})
    response = respond(grown, failure({0}), decision(), True, anything, LIMITS, NOW)
    assert response.tier is Tier.FROM_CHECKPOINT and response.effects == RESTART
    assert all("no survivor holds the task's state" in e.why for e in response.escalations)
    kept = respond(grown, failure({3}, "b"), decision(), True, anything, LIMITS, NOW)
    (switch,) = [e for e in kept.effects if isinstance(e, Switch)]
    assert kept.tier is Tier.RESTART_FAILED and switch.membership.ranks == {0: 0, 1: 1, 2: 2}


def test_unknown_failed_ranks_or_a_restart_policy_restart_the_generation() -> None:
    for failed, may_stay, why in [(None, True, "not known"), ({1}, False, "run.recovery: restart")]:
        response = respond(snapshot(), failure(failed), decision(), may_stay, anything, LIMITS, NOW)
        assert response.tier is Tier.FROM_CHECKPOINT and response.effects == RESTART
        assert why in response.escalations[0].why


def test_a_failed_task_stops_with_its_reason() -> None:
    response = respond(snapshot(), failure({1}), decision(Tier.FAIL_TASK), True, anything, LIMITS, NOW)
    assert response.tier is Tier.FAIL_TASK
    assert not any(isinstance(e, Switch) for e in response.effects)
    down = [e for e in response.effects if isinstance(e, TaskDown)]
    assert down == [TaskDown("lm", TaskState.FAILED, reason="rank 1 died: test")]


def test_a_node_already_out_is_not_isolated_again() -> None:
    out = snapshot(NodeState.ISOLATED)
    response = respond(
        out, failure({1}), decision(Tier.RECONFIGURE, isolate=True), True, anything, LIMITS, NOW
    )
    assert not any(isinstance(e, Isolate) for e in response.effects)


def test_restarting_stuck_ranks_stops_exactly_those() -> None:
    stay = in_place(snapshot(), "lm", {2}, usable=anything)
    assert not isinstance(stay, str)
    assert [e.worker.rank for e in stay if isinstance(e, StopWorker)] == [2]
    (switch,) = [e for e in stay if isinstance(e, Switch)]
    assert switch.membership.ranks == {0: 0, 1: 1, 3: 2}


# ---------------------------------------------------------------- the plan, task by task


def move(after: int, wanted: dict[str, int], in_place: bool = True, growing: bool = False) -> Move:
    members = snapshot().live("lm")
    return move_for(task(), after, wanted, members, in_place, growing, usable=even, generation=6)


def test_a_grow_that_adds_to_where_the_members_are_is_in_place() -> None:
    grow = move(6, {"a": 2, "b": 2, "c": 2})
    assert grow.kind is MoveKind.GROW and grow.extra == {"c": 2}
    # A placement that moves members cannot be reached by adding newcomers: restart.
    assert move(6, {"a": 1, "b": 2, "c": 3}).kind is MoveKind.RESTART
    assert move(6, {"a": 2, "b": 2, "c": 2}, in_place=False).kind is MoveKind.RESTART
    assert move(6, {"a": 2, "b": 2, "c": 2}, growing=True).kind is MoveKind.KEEP
    # Past its final step the members save and leave: no newcomer is added; a shrink or a
    # restart is decided as before (a relaunch redoing its last steps is past it too).
    members, done = snapshot().live("lm"), replace(task(), step=100)
    moves = [(6, {"a": 2, "b": 2, "c": 2}), (2, {"b": 2}), (6, {"a": 1, "b": 2, "c": 3})]
    kinds = [move_for(done, *m, members, True, False, even, 6, last_step=100).kind for m in moves]
    assert kinds == [MoveKind.KEEP, MoveKind.SHRINK, MoveKind.RESTART]


def test_a_shrink_keeps_the_members_on_the_kept_nodes() -> None:
    shrink = move(2, {"b": 2})
    assert shrink.kind is MoveKind.SHRINK and shrink.shrink is not None
    assert shrink.shrink.membership.ranks == {2: 0, 3: 1} and shrink.shrink.membership.generation == 6
    assert [w.rank for w in shrink.shrink.left] == [0, 1]
    # Three members left is not a usable size here (even only): restart at the planned size.
    assert move(3, {"a": 2, "b": 1}).kind is MoveKind.RESTART


def test_a_task_not_running_is_launched_or_left_to_its_recovery() -> None:
    waiting = replace(task(), state=TaskState.WAITING, workers=0)
    assert move_for(waiting, 4, {"a": 2, "b": 2}, (), True, False, even, 6).kind is MoveKind.LAUNCH
    assert move_for(waiting, 0, {}, (), True, False, even, 6).kind is MoveKind.KEEP
    starting = replace(task(), state=TaskState.STARTING)
    assert move_for(starting, 2, {"b": 2}, (), True, False, even, 6).kind is MoveKind.KEEP


def test_members_on_a_drained_node_move_off_without_a_restart() -> None:
    """Node ``a`` is drained (out of service) while ranks 0-1 run there: newcomers join first
    where the plan wants the task, then the members on ``a`` leave; the members leave first when
    the larger size is not usable; only a task that cannot move in place restarts."""
    members = snapshot().live("lm")

    def off(
        wanted: dict[str, int],
        usable: Callable[[int], bool] = even,
        in_place: bool = True,
        up: set[str] | None = None,
    ) -> Move:
        service = up if up is not None else {"b", "c"}
        return move_for(task(), 4, wanted, members, in_place, False, usable, 6, in_service=service)

    grow = off({"b": 2, "c": 2})
    assert grow.kind is MoveKind.GROW and grow.extra == {"c": 2}
    four_at_most = off({"b": 2, "c": 2}, usable=lambda n: n in (2, 4))
    assert four_at_most.kind is MoveKind.SHRINK and four_at_most.shrink is not None
    assert four_at_most.shrink.membership.ranks == {2: 0, 3: 1}
    assert off({"b": 2, "c": 2}, in_place=False).kind is MoveKind.RESTART
    assert off({"c": 2}, usable=lambda n: n in (2, 4), up={"c"}).kind is MoveKind.RESTART  # nobody stays
    # Without a drained node the same plan leaves the task as it is.
    assert move_for(task(), 4, {"a": 2, "b": 2}, members, True, False, even, 6).kind is MoveKind.KEEP


def test_isolation_and_drain_outlast_a_node_lost_and_back() -> None:
    node = NodeRecord(id=1, name="a", slots=2, gpus=[], host="h", state=NodeState.LOST, last_seen=0.0)
    assert returning_state(node, isolated_until=100.0, now=50.0) is NodeState.ISOLATED
    assert returning_state(node, isolated_until=100.0, now=150.0) is NodeState.HEALTHY
    assert returning_state(node, isolated_until=None, now=1e12) is NodeState.ISOLATED  # until resumed
    drained = replace(node, drained=True)  # lost while an admin's drain held
    assert returning_state(drained, isolated_until=0.0, now=150.0) is NodeState.DRAINING
    draining = replace(node, state=NodeState.DRAINING, drained=True)
    assert returning_state(draining, isolated_until=0.0, now=1.0) is NodeState.DRAINING
    assert returning_state(None, isolated_until=0.0, now=1.0) is NodeState.HEALTHY
    # The drain begins with the drain, outlasts a loss, ends with the resume.
    assert drained_across(node, NodeState.DRAINING) and drained_across(drained, NodeState.LOST)
    assert not drained_across(node, NodeState.LOST) and not drained_across(drained, NodeState.HEALTHY)
    assert drained_across(replace(node, state=NodeState.DRAINING), NodeState.LOST)  # (a row without the flag)


def test_a_stalled_recovery_escalates_one_tier_acting_on_the_members_stuck_on_the_way() -> None:
    members = snapshot().live("lm")
    stuck = tuple(w for w in members if w.rank == 2)  # on node b
    reattempt = Stalled("lm", Tier.REATTEMPT, 3, members, stuck, frozenset())
    response = escalate(snapshot(), reattempt, True, anything, LIMITS, NOW)
    assert response.tier is Tier.RESTART_FAILED
    assert [e.worker.rank for e in response.effects if isinstance(e, StopWorker)] == [2]
    assert response.escalations[0].why == "no step within 20 s; rank(s) [2] never reached generation 3"
    restart = replace(reattempt, tier=Tier.RESTART_FAILED)
    response = escalate(snapshot(), restart, True, anything, LIMITS, NOW)
    assert response.tier is Tier.RECONFIGURE and isinstance(response.effects[0], Isolate)
    assert response.effects[0].node == "b"
    (switch,) = [e for e in response.effects if isinstance(e, Switch)]
    assert sorted(switch.membership.ranks) == [0, 1]  # node b's members left with it
    nobody = replace(reattempt, stuck=members, stuck_before=frozenset({"a"}))
    response = escalate(snapshot(), nobody, True, anything, LIMITS, NOW)
    assert response.tier is Tier.FROM_CHECKPOINT and isinstance(response.effects[0], Isolate)
    assert [(e.from_tier, e.to_tier) for e in response.escalations] == [
        (Tier.REATTEMPT, Tier.RESTART_FAILED),
        (Tier.RESTART_FAILED, Tier.RECONFIGURE),
        (Tier.RECONFIGURE, Tier.FROM_CHECKPOINT),
    ]
    assert response.effects[1:] == RESTART


def test_no_node_is_isolated_past_the_isolation_budget() -> None:
    """Two nodes: at most one (max_isolated_fraction 0.25 of 2, at least one) is isolated at
    once. With b isolated already, a is not taken out: reconfigure cannot apply, says why, and
    the task restarts from its checkpoint."""
    nodes = {"a": node("a"), "b": node("b", NodeState.ISOLATED)}
    out = replace(
        snapshot(), nodes=nodes, members={"lm": tuple(w for w in snapshot().live("lm") if w.node == "a")}
    )
    response = respond(
        out, failure({1}), decision(Tier.RECONFIGURE, isolate=True), True, anything, LIMITS, NOW
    )
    assert not any(isinstance(e, Isolate) for e in response.effects)
    assert response.tier is Tier.FROM_CHECKPOINT
    assert "1 of 2 nodes are isolated already" in response.escalations[0].why
    # With a budget of both, it is.
    both = Settings(max_isolated_fraction=1.0)
    response = respond(out, failure({1}), decision(Tier.RECONFIGURE, isolate=True), True, anything, both, NOW)
    assert isinstance(response.effects[0], Isolate) and response.effects[0].node == "a"


def test_a_lost_node_whose_isolation_runs_counts_against_the_budget() -> None:
    """Node b was isolated, then lost: it comes back isolated, so its isolation still counts
    (else a second node was isolated meanwhile, and both were out once b returned)."""
    lost = replace(snapshot(NodeState.HEALTHY), isolated_until={"b": NOW + 100.0})
    lost = replace(lost, nodes={"a": node("a"), "b": node("b", NodeState.LOST)})
    response = respond(
        lost, failure({1}), decision(Tier.RECONFIGURE, isolate=True), True, anything, LIMITS, NOW
    )
    assert not any(isinstance(e, Isolate) for e in response.effects)
    over = replace(lost, isolated_until={"b": NOW - 1.0})  # its isolation ended meanwhile
    response = respond(
        over, failure({1}), decision(Tier.RECONFIGURE, isolate=True), True, anything, LIMITS, NOW
    )
    assert isinstance(response.effects[0], Isolate) and response.effects[0].node == "a"

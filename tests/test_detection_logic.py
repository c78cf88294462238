"""Pure logic of detection and handling: the timeout ordering, the ladder, the monitor."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from unicron.control.detect.monitor import TaskMonitor
from unicron.core.ladder import Counted, Decision, Ladder
from unicron.core.settings import Settings
from unicron.core.taxonomy import ErrorKind, Scope
from unicron.core.tiers import Tier


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"heartbeat_interval_s": 3.0}, "heartbeat_interval_s (3) must be < heartbeat_deadline_s"),
        ({"hang_cap_s": 1000.0}, "hang_cap_s (1000) must be < process_group_timeout_s"),
        ({"hang_floor_s": 400.0}, "hang_floor_s (400) must be <= hang_cap_s"),
        ({"failure_stop_grace_s": 5.0}, "failure_stop_grace_s (5) must be <= stop_grace_s"),
        ({"heartbeat_deadline_s": 400.0}, "heartbeat_deadline_s (400) must be < hang_cap_s"),
        ({"first_step_timeout_s": 1000.0}, "first_step_timeout_s (1000) must be < process_group_timeout_s"),
        ({"first_step_timeout_s": 2.0}, "heartbeat_deadline_s (2.5) must be < first_step_timeout_s"),
    ],
)
def test_inconsistent_timeouts_are_refused_with_the_fix(changes: dict[str, float], words: str) -> None:
    with pytest.raises(ValidationError) as info:
        Settings(**changes)
    assert words in str(info.value) and "fix:" in str(info.value)


def test_hang_deadline_is_clamped() -> None:
    s = Settings(hang_floor_s=1.0, hang_cap_s=60.0, hang_multiple=3.0)
    assert s.hang_deadline(0.1) == 1.0
    assert s.hang_deadline(2.0) == 6.0
    assert s.hang_deadline(100.0) == 60.0


def carried_out(ladder: Ladder, task: str, kind: ErrorKind, node: str | None, now: float) -> Decision:
    """The ladder's decision, counted as the coordinator counts one it carries out."""
    decision = ladder.decide(task, kind, node, now)
    ladder.count(decision.counted)
    return decision


def test_ladder_escalates_isolates_and_gives_up() -> None:
    ladder = Ladder(Settings(max_reattempts=2, max_restarts=1, isolate_after=2, task_failure_limit=5))
    first = []
    for i in range(4):  # each tier asked for is carried out: the ladder counts what was done
        first.append(carried_out(ladder, "t", ErrorKind.NCCL_TIMEOUT, None, float(i)).tier)
        ladder.carried("t", first[-1], float(i))
    assert first == [Tier.REATTEMPT, Tier.REATTEMPT, Tier.RESTART_FAILED, Tier.RECONFIGURE]
    # SEV1 hardware errors isolate their node at once; SEV2 ones after repeats on the same node.
    ecc = carried_out(ladder, "u", ErrorKind.ECC_ERROR, "n1", 10.0)
    assert ecc.tier is Tier.RECONFIGURE and ecc.isolate_node
    other = Ladder(Settings(isolate_after=2))
    assert not carried_out(other, "v", ErrorKind.CUDA_ERROR, "n2", 0.0).isolate_node
    assert carried_out(other, "w", ErrorKind.CUDA_ERROR, "n2", 1.0).isolate_node
    assert not carried_out(ladder, "t", ErrorKind.NODE_LOST, "n3", 11.0).isolate_node  # already out
    assert carried_out(ladder, "t", ErrorKind.CUDA_ERROR, None, 12.0).fail_task  # 6th failure of t
    # Outside the window, history no longer counts.
    assert ladder.decide("t", ErrorKind.NCCL_TIMEOUT, None, now=10_000.0).tier is Tier.REATTEMPT


def test_the_ladder_decides_without_counting_and_counts_what_it_is_given() -> None:
    """A decision changes nothing (deciding again decides alike); it says what it counts, and the
    ladder counts that when told to (the coordinator, once it carries the decision out)."""
    ladder = Ladder(Settings(isolate_after=2, task_failure_limit=3, same_fault_limit=2))
    first = ladder.decide("t", ErrorKind.CUDA_ERROR, "n1", 1.0)
    assert ladder.decide("t", ErrorKind.CUDA_ERROR, "n1", 1.0) == first and ladder == Ladder(ladder.settings)
    assert first.counted == Counted("t", ErrorKind.CUDA_ERROR, 1.0, "n1", same=False)
    ladder.count(first.counted)
    second = ladder.decide("t", ErrorKind.CUDA_ERROR, "n1", 2.0)
    assert second.isolate_node and "node n1 had 2 errors" in second.why  # the first one counted
    task_fault = ladder.decide("t", ErrorKind.CUDA_ERROR, "n1", 2.0, Scope.TASK)
    assert task_fault.counted == Counted("t", ErrorKind.CUDA_ERROR, 2.0, None, same=True)  # no node blamed
    ladder.count(task_fault.counted)
    assert ladder.node_errors == {"n1": [(1.0, "t", ErrorKind.CUDA_ERROR)]}
    assert ladder.decide("t", ErrorKind.CUDA_ERROR, "n2", 3.0, Scope.TASK).fail_task  # the 3rd failure
    ladder.count(None)  # (a decision that counts nothing: an incident widened)
    assert ladder.failures == {"t": [1.0, 2.0]}


def test_the_ladder_counts_only_tiers_carried_out() -> None:
    """A reattempt asked for but not carried out (the task relaunches instead) is not counted
    as one: the next failure asks for a reattempt again."""
    ladder = Ladder(Settings(max_reattempts=1))
    for at in (1.0, 2.0, 3.0):
        assert carried_out(ladder, "t", ErrorKind.CONNECTION_RESET, None, at).tier is Tier.REATTEMPT
        ladder.carried("t", Tier.FROM_CHECKPOINT, at)
    ladder.carried("t", Tier.REATTEMPT, 4.0)
    assert ladder.decide("t", ErrorKind.CONNECTION_RESET, None, 5.0).tier is Tier.RESTART_FAILED


def test_monitor_finds_late_steps_after_warm_up() -> None:
    monitor = TaskMonitor(Settings(hang_warmup_steps=3, hang_floor_s=0.5, hang_multiple=3.0, hang_cap_s=60.0))
    for step in range(1, 4):
        monitor.step_done(step, ended=step * 1.0)
    # Two intervals seen, three needed: no step time to go by yet, so the cap.
    assert monitor.deadline() == pytest.approx(60.0)
    assert not monitor.late(now=62.9) and monitor.late(now=63.1)
    monitor.step_done(4, ended=4.0)
    assert monitor.deadline() == pytest.approx(3.0)
    assert not monitor.late(now=6.9) and monitor.late(now=7.1)


def test_monitor_names_a_persistent_straggler_once_and_clears_it_as_slowly() -> None:
    monitor = TaskMonitor(Settings(straggler_ratio=1.5, straggler_window=3))
    changes: list[tuple[int, bool]] = []

    def steps(first: int, computes: list[list[float]]) -> None:
        for step, per_rank in enumerate(computes, start=first):
            for rank, compute in enumerate(per_rank):
                changes.extend(monitor.rank_compute(step, rank, compute, world=4))

    slow, even = [1.0, 1.0, 1.1, 2.0], [1.0, 1.0, 1.0, 1.0]
    steps(1, [slow, slow])
    assert changes == []  # two slow steps of three
    steps(3, [slow])
    assert changes == [(3, True)]
    # Loaded peers (or one quick step) between slow ones: still a straggler, not a flap.
    steps(4, [slow, [2.0, 2.0, 1.0, 2.0], even, slow, slow])
    monitor.rank_compute(8, 3, 1.0, world=4)  # a report of a judged step, sent again
    assert changes == [(3, True)]
    steps(9, [even, even])
    assert changes == [(3, True)]
    steps(11, [even])  # as many steps within the bound as it took to be named
    assert changes == [(3, True), (3, False)]


def test_monitor_re_anchors_after_a_rewind() -> None:
    monitor = TaskMonitor(Settings(hang_warmup_steps=2, hang_floor_s=0.5))
    for step in range(1, 6):
        monitor.step_done(step, ended=float(step))
    monitor.step_done(2, ended=100.0)  # restarted from a checkpoint at step 1
    assert not monitor.late(now=100.5)
    assert monitor.late(now=104.0)


def test_a_node_not_heard_since_the_coordinator_started_gets_the_agents_retry_pause_on_top() -> None:
    """After a start, a takeover or a stall at t=100, an agent that failed meanwhile may be in
    its longest retry pause (AGENT_RETRY_CAP_S): it is lost only after that plus the deadline.
    A node heard since then follows the usual deadline."""
    from unicron.brain.records import NodeRecord
    from unicron.control.detect.nodewatch import silent_nodes
    from unicron.core.protocol import AGENT_REQUEST_TIMEOUT_S, AGENT_RETRY_CAP_S
    from unicron.core.states import NodeState

    limits = Settings()
    deadline = limits.heartbeat_deadline_s
    away = NodeRecord(1, "away", 1, [], "h", NodeState.HEALTHY, last_seen=90.0)
    heard = NodeRecord(2, "heard", 1, [], "h", NodeState.HEALTHY, last_seen=103.0)
    edge = 100 + AGENT_RETRY_CAP_S + deadline
    found = silent_nodes([away, heard], edge - 0.1, 100.0, deadline)
    assert found == [("heard", pytest.approx(edge - 103.1))]
    assert [n for n, _ in silent_nodes([away, heard], edge + 0.1, 100.0, deadline)] == ["away", "heard"]
    assert silent_nodes([heard], 103.0 + limits.heartbeat_deadline_s - 0.1, 100.0, deadline) == []
    # Heard within an agent's request timeout of then: perhaps a request its agent gave up on
    # during a stall, read from the backlog; its agent may still be pausing, so the pause holds.
    stale = NodeRecord(
        3, "stale", 1, [], "h", NodeState.HEALTHY, last_seen=100.0 + AGENT_REQUEST_TIMEOUT_S - 0.1
    )
    assert silent_nodes([stale], edge - 0.1, 100.0, deadline) == []
    assert [n for n, _ in silent_nodes([stale], edge + 0.1, 100.0, deadline)] == ["stale"]


@pytest.mark.parametrize(
    ("action", "from_injection"), [("kill", True), ("late_stop", False), ("corrupt_transfer", False)]
)
def test_only_a_fault_that_fails_a_process_is_taken_as_the_start_of_the_failure_after_it(
    make: Any, action: str, from_injection: bool
) -> None:
    """An injected kill is when the failure began: detection is timed from it. A stop taken late
    or a corrupted transfer fails nothing: a real failure after it is timed from its own report."""
    from unicron.core.protocol import FaultReport

    cluster = make()
    node, _ = cluster.running[("lm", 1, 0)]
    injected = cluster.clock.now
    cluster.beat(
        node, FaultReport(task="lm", generation=1, rank=0, step=2, action=action, time=injected, index=0)
    )
    cluster.clock.now += 3.0
    died = cluster.clock.now
    cluster.clock.now += 0.05
    cluster.exit(0, code=None, signal=9, at=died)
    (incident,) = cluster.events("incident")
    assert incident["fault_at"] == (injected if from_injection else died)
    assert incident["detection_s"] == pytest.approx(3.05 if from_injection else 0.05)

"""What one failure decides, as a value (``brain/deciding.py``): hand-built tasks,
incidents, ladders and snapshots, no store, no processes, no clock. The decision changes nothing;
the coordinator carries it out (tests/test_tiers.py checks what its orders then do)."""

from __future__ import annotations

from dataclasses import replace

from unicron.brain.deciding import Facts, Incident, Opened, Passed, Seen, Widened, decide
from unicron.brain.effects import StopWorker, Switch, TaskDown
from unicron.brain.response import Failure
from unicron.brain.snapshot import Snapshot
from unicron.core.ladder import Counted, Ladder
from unicron.core.settings import Settings
from unicron.core.states import TaskState
from unicron.core.taxonomy import ErrorKind, Scope
from unicron.core.tiers import Tier

from .test_response import LIMITS, NOW, anything, snapshot, task

IN_PLACE = Facts(in_process=True, growing=False, usable=anything)
CRASH = ErrorKind.EXITED_ABNORMALLY


def crash(rank: int = 1, node: str = "a", generation: int | None = 3) -> Seen:
    return Seen(Failure("lm", node, f"rank {rank} died", frozenset({rank})), CRASH, Scope.WORKER, generation)


def test_a_crash_opens_an_incident_whose_response_restarts_the_failed_rank_and_counts_nothing_yet() -> None:
    ladder = Ladder(LIMITS)
    decided = decide(task(), crash(), [], ladder, snapshot, IN_PLACE, LIMITS, NOW)
    assert isinstance(decided, Opened)
    assert (decided.asked.tier, decided.response.tier, decided.response.escalations) == (
        Tier.RESTART_FAILED,
        Tier.RESTART_FAILED,
        (),
    )
    stop, switch, down = decided.response.effects
    assert isinstance(stop, StopWorker) and stop.worker.rank == 1
    assert isinstance(switch, Switch) and sorted(w.rank for w in switch.kept) == [0, 2, 3]
    assert switch.membership.generation == 6 and down == TaskDown("lm", TaskState.STARTING)
    assert decided.asked.counted == Counted("lm", CRASH, NOW, "a", same=False)
    assert ladder == Ladder(ladder.settings)  # counted only when carried out


def test_the_same_kill_reported_from_another_worker_widens_the_incident_and_counts_nothing() -> None:
    """Rank 1's crash re-formed generation 6 (not trained yet); rank 2, killed with it, reports
    from generation 3: the same event. Its tier is carried out again without rank 2."""
    formed = replace(task(generation=6), state=TaskState.STARTING, workers=3)
    incident = Incident(7, CRASH, NOW - 1.0, [Tier.RESTART_FAILED], generation=3, formed=6)
    after = snapshot()
    members = tuple(replace(w, generation=6) for w in after.members["lm"] if w.rank != 1)
    state = replace(after, tasks={"lm": formed}, members={"lm": members}, next_generation={"lm": 7})

    def read() -> Snapshot:
        return state

    decided = decide(formed, crash(2, "b"), [incident], Ladder(LIMITS), read, IN_PLACE, LIMITS, NOW)
    assert isinstance(decided, Widened) and decided.incident is incident
    assert decided.asked.tier is Tier.RESTART_FAILED and decided.asked.counted is None
    assert decided.asked.why == "the same event as incident 7"
    switch = next(e for e in decided.response.effects if isinstance(e, Switch))
    assert switch.old == 6 and switch.membership.generation == 7 and len(switch.kept) == 2
    # A worker that had reached the re-formed generation fails anew: its own incident.
    assert isinstance(
        decide(formed, crash(2, "b", 6), [incident], Ladder(LIMITS), read, IN_PLACE, LIMITS, NOW), Opened
    )
    # So does one past the window the event is judged by.
    late = NOW + LIMITS.task_fault_window_s + 2.0
    assert isinstance(
        decide(formed, crash(2, "b"), [incident], Ladder(LIMITS), read, IN_PLACE, LIMITS, late), Opened
    )


def test_a_failure_of_a_generation_with_an_incident_or_of_a_task_not_running_decides_nothing() -> None:
    open_one = Incident(3, CRASH, NOW - 1.0, [Tier.RESTART_FAILED], generation=3)

    def unread() -> Snapshot:  # (a decision that responds to nothing reads no copy of the cluster)
        raise AssertionError("read")

    assert (
        decide(task(), crash(), [open_one], Ladder(LIMITS), unread, IN_PLACE, LIMITS, NOW) is Passed.ANSWERED
    )
    stopping = replace(task(), state=TaskState.RESTARTING)
    assert decide(stopping, crash(), [], Ladder(LIMITS), unread, IN_PLACE, LIMITS, NOW) is Passed.INACTIVE


def test_the_ladders_counts_and_the_tasks_mode_decide_the_tier() -> None:
    """Restarted too often: the ladder asks for a reconfiguration (node a leaves); a task that
    recovers by relaunching goes from its checkpoint; one whose grow is under way still recovers
    in place (the grow is given up as the incident opens)."""
    ladder = Ladder(Settings(max_restarts=1))
    ladder.carried("lm", Tier.RESTART_FAILED, NOW - 10.0)
    decided = decide(task(), crash(), [], ladder, snapshot, IN_PLACE, LIMITS, NOW)
    assert isinstance(decided, Opened) and decided.response.tier is Tier.RECONFIGURE
    relaunching = Facts(in_process=False, growing=False, usable=anything)
    decided = decide(task(), crash(), [], Ladder(LIMITS), snapshot, relaunching, LIMITS, NOW)
    assert isinstance(decided, Opened) and decided.response.tier is Tier.FROM_CHECKPOINT
    assert [e.why for e in decided.response.escalations] != []  # each tier passed says why
    growing = Facts(in_process=True, growing=True, usable=anything)
    decided = decide(task(), crash(), [], Ladder(LIMITS), snapshot, growing, LIMITS, NOW)
    assert isinstance(decided, Opened) and decided.response.tier is Tier.RESTART_FAILED

"""The tier recorded is the tier carried out, for every kind of the taxonomy.

Each kind is raised in a task of 4 ranks on two nodes (the coordinator stepped by hand,
``tests/fakecluster.py``), in both recovery modes; what the coordinator ordered tells which tier
it carried out (which processes it stopped, which it renamed into a generation re-formed in
place, which node it took out, whether it relaunched the task), and that must be the tier its
incident records. The expected tiers are the taxonomy's first tiers as the ladder asks for them,
less what cannot apply (a process that raised is gone, so it is not reattempted; a task that
recovers by relaunching relaunches).
"""

from __future__ import annotations

from typing import Any

import pytest

from unicron.core.protocol import ExceptionReport, LaunchWorker, RenameWorkers, StopWorkers
from unicron.core.states import NodeState, TaskState
from unicron.core.taxonomy import TAXONOMY, ErrorKind
from unicron.core.tiers import Escalation, Tier, first_applicable, precondition

# Kinds a survivor's collective error reports: every rank raises it, and nobody died.
EVERY_RANK = {
    ErrorKind.NCCL_TIMEOUT,
    ErrorKind.CONNECTION_RESET,
    ErrorKind.CONNECTION_REFUSED,
    ErrorKind.OTHER_NETWORK_ERROR,
}
# Raised by rank 1 on n0 in a task that recovers in place: what is carried out.
IN_PLACE = {
    **{k: Tier.RECONFIGURE for k, info in TAXONOMY.items() if info.tier is Tier.RECONFIGURE},
    **{k: Tier.RESTART_FAILED for k, info in TAXONOMY.items() if info.tier is Tier.RESTART_FAILED},
    **{k: Tier.REATTEMPT for k in EVERY_RANK},
    ErrorKind.LINK_FLAPPING: Tier.RESTART_FAILED,  # SEV3, but the raising process is gone
    **{k: Tier.FAIL_TASK for k, info in TAXONOMY.items() if info.tier is Tier.FAIL_TASK},
    # Every rank raises it, and none can be trusted: the task goes back to its checkpoint.
    **{k: Tier.FROM_CHECKPOINT for k, info in TAXONOMY.items() if info.tier is Tier.FROM_CHECKPOINT},
}
# Kinds whose first tier ends the task, in either mode (nothing to restart: data that gives NaN).
ENDS_TASK = {k for k, info in TAXONOMY.items() if info.tier is Tier.FAIL_TASK}
# A heartbeat's silence; an exit; a fault the ranks undid in the step (``NumericalReport``).
NOT_RAISED = {
    ErrorKind.NODE_LOST,
    ErrorKind.EXITED_ABNORMALLY,
    ErrorKind.NUMERICAL_TRANSIENT,
    ErrorKind.NUMERICAL_SKIPPED,
    ErrorKind.GRADIENT_SPIKE,
    ErrorKind.REPLICA_REPAIRED,
}


def observed(cluster: Any, since: int, generation: int) -> Tier:
    """The tier the coordinator's orders since ``since`` carried out on ``generation``."""
    orders = [o for _, o in cluster.orders[since:]]
    task = cluster.c.store.get_task("lm")
    if task.state is TaskState.FAILED:
        return Tier.FAIL_TASK
    whole = [
        o for o in orders if isinstance(o, StopWorkers) and o.rank is None and o.generation == generation
    ]
    if task.state is TaskState.RESTARTING and whole:
        return Tier.FROM_CHECKPOINT
    assert not [o for o in orders if isinstance(o, LaunchWorker)], orders  # nothing relaunched
    renames = [o for o in orders if isinstance(o, RenameWorkers) and o.generation == generation]
    renamed = {rank for o in renames for rank in o.ranks}
    stopped = {o.rank for o in orders if isinstance(o, StopWorkers) and o.generation == generation}
    if cluster.c.store.node("n0").state is NodeState.ISOLATED:
        assert renamed == {2, 3}, (renamed, orders)  # n0's ranks left with it
        return Tier.RECONFIGURE
    if renamed == {0, 2, 3}:  # only the failed process ended (stopped, unless it exited)
        assert stopped <= {1}, orders
        return Tier.RESTART_FAILED
    assert renamed == {0, 1, 2, 3} and not stopped, orders  # every process stays
    return Tier.REATTEMPT


def raise_kind(cluster: Any, kind: ErrorKind) -> None:
    task = cluster.c.store.get_task("lm")
    ranks = range(4) if kind in EVERY_RANK else [1]
    for rank in ranks:
        node, _ = cluster.running[("lm", task.generation, rank)]
        error = ExceptionReport(
            task="lm",
            generation=task.generation,
            rank=rank,
            step=2,
            kind=kind.value,
            error_type="RuntimeError",
            message=f"injected {kind.value}",
            time=cluster.clock.now,
        )
        cluster.beat(node, error)


@pytest.mark.parametrize("recovery", ["in_process", "restart"])
@pytest.mark.parametrize("kind", sorted(set(ErrorKind) - NOT_RAISED))
def test_every_kind_records_the_tier_its_orders_carry_out(make: Any, kind: ErrorKind, recovery: str) -> None:
    cluster = make(recovery=recovery, isolation_s=1000.0)
    generation, since = cluster.c.store.get_task("lm").generation, len(cluster.orders)
    raise_kind(cluster, kind)
    (incident,) = cluster.events("incident")
    carried = observed(cluster, since, generation)
    assert incident["action"] == carried.label, incident
    assert incident["asked"] == TAXONOMY[kind].tier.label
    relaunched = Tier.FAIL_TASK if kind in ENDS_TASK else Tier.FROM_CHECKPOINT
    assert carried is (IN_PLACE[kind] if recovery == "in_process" else relaunched)
    passed = [(e["from_action"], e["to_action"]) for e in cluster.events("escalation")]
    asked, steps = TAXONOMY[kind].tier, []
    while asked < carried:  # every tier passed on the way is recorded, with its reason
        steps.append((asked.label, asked.next().label))
        asked = asked.next()
    assert passed == steps and all(e["why"] for e in cluster.events("escalation"))


def test_an_exit_restarts_the_failed_process_and_a_lost_node_reconfigures(make: Any) -> None:
    cluster = make(isolation_s=1000.0)
    since = len(cluster.orders)
    cluster.exit(1)
    (incident,) = cluster.events("incident")
    assert incident["action"] == observed(cluster, since, 1).label == "restart failed processes"

    lost = make()
    for _ in range(5):  # heard past an agent's request timeout since the coordinator started
        lost.step(0.5)
    held = lost.c.store.get_task("lm").generation
    for _ in range(12):  # n0 falls silent past the heartbeat deadline
        lost.clock.now += 0.5
        lost.beat("n1")
        lost.c.tick()
    (incident,) = lost.events("incident")
    assert incident["kind"] == "node_lost" and incident["action"] == "reconfigure"
    (switch,) = lost.events("in_process_recovery")
    assert switch["generation"] == held + 1 and switch["workers"] == 2 and switch["failed"] == [0, 1]


def test_first_applicable_passes_tiers_that_cannot_apply_and_says_why() -> None:
    def why_not(tier: Tier) -> str | None:
        return precondition(tier, in_place=True, failed=frozenset({3}), node=None)

    tier, passed = first_applicable(Tier.REATTEMPT, why_not)
    assert tier is Tier.RESTART_FAILED
    assert passed == (Escalation(Tier.REATTEMPT, Tier.RESTART_FAILED, passed[0].why),)
    assert first_applicable(Tier.RECONFIGURE, why_not)[0] is Tier.FROM_CHECKPOINT  # no node to take out
    assert first_applicable(Tier.FAIL_TASK, lambda t: "never")[0] is Tier.FAIL_TASK
    assert [t.label for t in Tier] == [
        "reattempt in place",
        "restart failed processes",
        "reconfigure",
        "restart from checkpoint",
        "fail task",
    ]

"""One sequence of failures, fed to the coordinator and to the simulator: the same decisions.

The coordinator is stepped by hand (``tests/fakecluster.py``: one task of 4 ranks on two nodes
of 2 slots); the simulator runs the same task on the same cluster with the same ladder
thresholds. Both decide with the same code (``brain/deciding.py:decide``: the ladder's ask and
the tier that applies); this checks that what each feeds it (the task's workers and the failed
ranks, the nodes' states, whether the task recovers in place) agrees, so that the tiers asked
for and carried out agree failure by failure. The simulator's view of its cluster as the brain
reads it (``sim/brainview.py``) is checked on its own below.
"""

from __future__ import annotations

from typing import Any

import pytest

from unicron.brain.deciding import Facts, Opened, Seen, decide
from unicron.brain.records import WorkerRecord
from unicron.core.ladder import Ladder
from unicron.core.protocol import ExceptionReport
from unicron.core.settings import Settings
from unicron.core.specs import ClusterSpec, TaskSpec
from unicron.core.states import NodeState, WorkerPhase
from unicron.core.taxonomy import TAXONOMY, ErrorKind
from unicron.core.tiers import Tier
from unicron.sim.brainview import GENERATION, Views, members_of
from unicron.sim.engine import HOUR, Simulation
from unicron.sim.policies import UnicronPolicy, UnicronSettings
from unicron.sim.traces import Failure

from .test_tiers import EVERY_RANK

GAP_S = 60.0  # between failures: within the escalation window (600 s), so repeats count
WINDOW_S, ISOLATE_AFTER = 600.0, 2
SEQUENCES = {
    "a crash, then connections reset until a reattempt is not enough": [
        (ErrorKind.CUDA_ERROR, 0),
        (ErrorKind.CONNECTION_RESET, 1),
        (ErrorKind.CONNECTION_RESET, 1),
        (ErrorKind.CONNECTION_RESET, 1),
    ],
    "an ECC error": [(ErrorKind.ECC_ERROR, 1)],
    "crashes on one node until it is isolated": [
        (ErrorKind.ILLEGAL_MEMORY_ACCESS, 0),
        (ErrorKind.CUDA_ERROR, 0),
    ],
}


def coordinator_tiers(
    make: Any, failures: list[tuple[ErrorKind, int]], recovery: str
) -> list[tuple[Tier, Tier]]:
    cluster = make(
        recovery=recovery, escalation_window_s=WINDOW_S, isolate_after=ISOLATE_AFTER, isolation_s=10 * GAP_S
    )
    step = 1
    for kind, node in failures:
        task = cluster.c.store.get_task("lm")
        members = sorted((r, n) for (t, g, r), (n, _) in cluster.running.items() if g == task.generation)
        raising = [r for r, n in members if kind in EVERY_RANK or n == f"n{node}"][
            : None if kind in EVERY_RANK else 1
        ]
        for rank in raising:
            where = next(n for r, n in members if r == rank)
            report = ExceptionReport(
                task="lm",
                generation=task.generation,
                rank=rank,
                step=step + 1,
                kind=kind.value,
                error_type="RuntimeError",
                message=f"injected {kind.value}",
                time=cluster.clock.now,
            )
            cluster.beat(where, report)
        for _ in range(40):  # it recovers (a relaunch, or the re-formed group) and trains on
            cluster.step(0.5)
            if cluster.c.store.get_task("lm").state.value in ("starting", "running"):
                step += 1
                cluster.train(step)
        cluster.clock.now += GAP_S - 20.0
    incidents = cluster.events("incident")
    labels = {t.label: t for t in Tier}
    return [(labels[i["asked"]], labels[i["action"]]) for i in incidents]


def simulated_tiers(failures: list[tuple[ErrorKind, int]], in_place: bool) -> list[tuple[Tier, Tier]]:
    cluster = ClusterSpec(nodes=2, gpus_per_node=2, gpu="A100", node_mtbf_hours=1000)
    task = TaskSpec(name="lm", weight=1, throughput={1: 1.0e9, 2: 2.0e9, 3: 2.7e9, 4: 3.6e9})
    settings = UnicronSettings(
        isolate_after=ISOLATE_AFTER,
        isolate_window_hours=WINDOW_S / HOUR,
        isolation_hours=10 * GAP_S / HOUR,
        reattempt_failure_probability=0.0,
        in_place=in_place,
    )
    policy = UnicronPolicy(settings)
    trace = [Failure((i + 1) * GAP_S / HOUR, node, kind, 0.0) for i, (kind, node) in enumerate(failures)]
    Simulation(cluster, [task], trace, policy, hours=(len(failures) + 1) * GAP_S / HOUR, samples=4).run()
    return [(c.asked, c.tier) for c in policy.carried]


@pytest.mark.parametrize("recovery", ["in_process", "restart"])
@pytest.mark.parametrize("name", sorted(SEQUENCES))
def test_the_coordinator_and_the_simulator_decide_alike(make: Any, name: str, recovery: str) -> None:
    failures = SEQUENCES[name]
    live = coordinator_tiers(make, failures, recovery)
    simulated = simulated_tiers(failures, in_place=recovery == "in_process")
    assert len(live) == len(failures), live
    assert live == simulated, (name, live, simulated)


def test_the_simulators_members_are_the_records_a_launch_would_have() -> None:
    made = members_of("lm", 8, "3", 4)
    assert made == [
        WorkerRecord("lm", GENERATION, 8 + i, "3", i, WorkerPhase.RUNNING, None, None, None, 0.0)
        for i in range(4)
    ]


def test_the_simulators_view_of_a_failure_is_the_cluster_by_rank_and_state() -> None:
    """Ranks in node order, the struck node's the failed ones; a node out of service isolated,
    the struck node lost when the engine took it out (its GPUs off the placement); a fault that
    kills no process fails no rank. Blocks of records are reused while their place holds."""
    views = Views(slots=4)
    assignment = {0: {"lm": 4}, 2: {"lm": 2, "other": 2}, 3: {"lm": 4}}
    nodes = views.nodes(5, {0, 2, 3, 4}, 1, out=True)
    assert {n: r.state for n, r in nodes.items()} == {
        "0": NodeState.HEALTHY,
        "1": NodeState.LOST,
        "2": NodeState.HEALTHY,
        "3": NodeState.HEALTHY,
        "4": NodeState.HEALTHY,
    }
    snapshot, failure = views.failure("lm", ErrorKind.ECC_ERROR, 1, 4, True, assignment, nodes, 14)
    live = snapshot.live("lm")
    assert [(w.rank, w.node) for w in live] == [(r, n) for r, n in enumerate("00001111223333")]
    assert failure.failed == frozenset({4, 5, 6, 7}) and failure.node == "1"
    assert snapshot.task("lm").workers == 14 and "other" not in snapshot.members
    again, _ = views.failure(
        "lm", ErrorKind.CONNECTION_RESET, 3, 4, False, assignment, views.nodes(5, {0, 2, 3}, 3, False), 10
    )
    assert again.live("lm")[0] is live[0]  # the first node's block, reused
    assert [w.rank for w in again.live("lm")] == list(range(10))
    assert again.nodes["1"].state is NodeState.ISOLATED and again.nodes["4"].state is NodeState.ISOLATED
    _, reset = views.failure("lm", ErrorKind.CONNECTION_RESET, 3, 4, False, assignment, nodes, 14)
    assert reset.failed == frozenset()  # SEV3: no process died
    # Growing back: the placement holds the newcomers' slots too; the members are the first 8
    # ranks (newcomers, ranked last, have not joined): two of node 3's four are members.
    growing, struck = views.failure("lm", ErrorKind.CUDA_ERROR, 3, 4, False, assignment, nodes, 8)
    assert [w.node for w in growing.live("lm")] == list("00002233") and struck.failed == frozenset({6, 7})


def test_a_node_whose_ranks_straddle_two_replicas_leaves_no_full_replica_to_recover_in_place() -> None:
    """Replicas of 8 on a task placed 4, 8 and 4 over three nodes: the middle node's ranks (4-11)
    are half of each replica, so no full replica survives its loss and the decision is a restart
    from the checkpoint. (The simulator models what the decision carries out; it once went on
    in place here, counting the replicas lost as the GPUs lost divided by the replica size.)"""
    views = Views(slots=8)
    assignment = {0: {"lm": 4}, 1: {"lm": 8}, 2: {"lm": 4}}
    nodes = views.nodes(3, {0, 2}, 1, out=True)
    snapshot, failure = views.failure("lm", ErrorKind.NODE_LOST, 1, 8, True, assignment, nodes, 16)
    facts = Facts(in_process=True, growing=False, usable=lambda n: n % 8 == 0, replica_size=8)
    ladder = Ladder(Settings())
    seen = Seen(failure, ErrorKind.NODE_LOST, TAXONOMY[ErrorKind.NODE_LOST].scope)
    decided = decide(snapshot.task("lm"), seen, (), ladder, lambda: snapshot, facts, Settings(), 0.0)
    assert isinstance(decided, Opened) and decided.asked.tier is Tier.RECONFIGURE
    assert decided.response.tier is Tier.FROM_CHECKPOINT, decided.response.escalations

"""One sequence of failures, fed to the coordinator and to the simulator: the same decisions.

The coordinator is stepped by hand (``tests/fakecluster.py``: one task of 4 ranks on two nodes
of 2 slots); the simulator runs the same task on the same cluster with the same ladder
thresholds. Both pick their tiers with the same code (``core/ladder.py``, ``core/tiers.py``);
this checks that what each feeds that code (the failed ranks, whether the task recovers in place,
whether survivors remain) agrees, so that the tiers asked for and carried out agree failure by
failure.
"""

from __future__ import annotations

from typing import Any

import pytest

from unicron.core.protocol import ExceptionReport
from unicron.core.specs import ClusterSpec, TaskSpec
from unicron.core.taxonomy import ErrorKind
from unicron.core.tiers import Tier
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

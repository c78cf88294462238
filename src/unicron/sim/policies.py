"""Policies: how Unicron and each baseline react to failures. Parameters and their sources are
listed in docs/simulation.md; every one can be overridden per scenario (``policy_settings``).

All policies start from the same allocation (the optimal plan for the full cluster), so the
comparison isolates failure handling and re-planning.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Literal

import numpy as np
from pydantic import Field

from unicron.sim import measured
from unicron.sim.engine import Simulation, TaskRun
from unicron.sim.policy_base import (
    CRASH_KINDS,
    DIVERGENCE_DOC,
    NOT_A_FAULT,
    NUMERICAL_KINDS,
    PolicySettings,
    allocation,
    held,
    iteration_s,
    replaced,
)
from unicron.sim.traces import Failure
from unicron.sim.unicron_policy import UnicronPolicy, UnicronSettings

__all__ = ["POLICY_NAMES", "MegatronPolicy", "MegatronSettings", "UnicronSettings", "make_policy"]

# ---------------------------------------------------------------------------------- Oracle


class OraclePolicy:
    """Instant detection, free transitions, the optimal plan at every moment."""

    name = "oracle"
    efficiency = 1.0
    tensor_parallel = True
    elastic = False

    def start(self, sim: Simulation) -> None:
        pass

    def on_failure(self, sim: Simulation, failure: Failure, hit: Mapping[str, int]) -> None:
        sim.set_allocation(sim.ideal()[1])

    def on_repair(self, sim: Simulation, node: int) -> None:
        sim.set_allocation(sim.ideal()[1])


# ---------------------------------------------------------------------------------- Megatron


class MegatronSettings(PolicySettings):
    """Each default says where it comes from, or that it is an assumption."""

    collective_timeout_s: float = Field(
        1800.0,
        ge=0,
        description="the timeout peers wait in a collective: torch.distributed's default for gloo",
    )
    exit_detection_s: float = Field(
        60.0, ge=0, description="the job fails once a rank exits: an assumption (no published figure)"
    )
    resubmit_s: float = Field(
        540.0,
        ge=0,
        description="waiting for the job to be rescheduled: the ~68 min breakdown in docs/design.md"
        " (not traced to a figure of the paper)",
    )
    setup_s: float = Field(
        840.0, ge=0, description="start-up, initialisation, checkpoint load: the same breakdown"
    )
    checkpoint_interval_s: float = Field(
        1800.0, gt=0, description="half of it is redone after a restart: an assumption (30 min)"
    )
    divergence_detection_s: float = Field(3600.0, ge=0, description=DIVERGENCE_DOC)
    on_node_loss: Literal["shrink", "wait"] = "shrink"


class MegatronPolicy:
    """Checkpoint restart with a fixed layout: every failure restarts the whole task."""

    name = "megatron"
    efficiency = 1.0
    tensor_parallel = True
    elastic = False

    def __init__(self, settings: MegatronSettings | None = None) -> None:
        self.s = settings or MegatronSettings()

    def start(self, sim: Simulation) -> None:
        pass

    def _restart(self, with_recompute: bool = True) -> list[tuple[float, str]]:
        parts = [(self.s.resubmit_s + self.s.setup_s, "restart")]
        if with_recompute:
            parts.append((self.s.checkpoint_interval_s / 2, "lost_work"))
        return parts

    def on_failure(self, sim: Simulation, failure: Failure, hit: Mapping[str, int]) -> None:
        if failure.kind in NOT_A_FAULT:
            return
        detect = self.s.exit_detection_s if failure.kind in CRASH_KINDS else self.s.collective_timeout_s
        if failure.kind in NUMERICAL_KINDS:  # (the restart's lost work: back to the checkpoint before)
            detect = self.s.divergence_detection_s
        node_out = failure.node not in sim.healthy
        for name, lost in hit.items():
            run = sim.tasks[name]
            if not node_out:
                sim.pause(name, [(detect, "detection"), *self._restart()], replace=True)
                continue
            survivors = run.gpus  # the engine already removed the lost workers
            if (size := replaced(sim, run, survivors, lost)) is not None:  # a spare takes its place
                sim.set_allocation(allocation(sim, {name: size}))
                sim.pause(name, [(detect, "detection"), *self._restart()], replace=True)
            elif self.s.on_node_loss == "shrink":
                budget = survivors + sim.free_gpus()
                smaller = sim.largest_usable(name, budget)
                sim.set_allocation(allocation(sim, {name: smaller}))
                sim.pause(name, [(detect, "detection"), *self._restart()], replace=True)
            else:
                run.waiting_rate = sim.potential(run, run.nominal) * survivors / max(run.nominal, 1)
                sim.pause(name, [(detect, "detection"), (math.inf, "repair_wait")], replace=True)

    def on_repair(self, sim: Simulation, node: int) -> None:
        for name, run in sorted(sim.tasks.items(), key=lambda kv: kv[1].gpus - kv[1].nominal):
            deficit = run.nominal - run.gpus
            if deficit <= 0 or sim.free_gpus() < deficit:
                continue
            waiting = any(c == "repair_wait" for _, c in run.segments)
            sim.set_allocation(allocation(sim, {name: run.nominal}))
            run.waiting_rate = None if not waiting else run.waiting_rate
            # A waiting task restarts from its checkpoint; a shrunk one checkpoints, then restarts.
            sim.pause(name, self._restart(with_recompute=waiting), replace=waiting)


# ---------------------------------------------------------------------------------- elastic baselines


class ElasticSettings(PolicySettings):
    efficiency: float = Field(1.0, gt=0, le=1, description="failure-free throughput vs its curve")
    tensor_parallel: bool = False
    crash_detection_s: float = Field(5.0, ge=0)
    hang_detection_s: float = Field(60.0, ge=0)
    failure_pause_s: float = Field(30.0, ge=0, description="whole-task pause to reconfigure or restart")
    lost_work: Literal["iteration", "checkpoint", "none"] = "iteration"
    checkpoint_interval_s: float = Field(1800.0, gt=0)
    survivors_continue: bool = Field(False, description="torchft: only the failed replica group stops")
    heal_s: float = Field(0.0, ge=0, description="a restarted replica group's restart and state transfer")
    rejoin_pause_s: float = Field(30.0, ge=0, description="whole-task pause when a repaired node rejoins")
    divergence_detection_s: float = Field(3600.0, ge=0, description=DIVERGENCE_DOC)


ELASTIC_DEFAULTS: dict[str, dict[str, Any]] = {
    # Oobleck (SOSP'23): pipeline templates over data parallelism, no tensor parallelism; it
    # reinstantiates pipelines from templates and copies missing layers from other replicas.
    # Failure-free efficiency: an assumption, 1.0 (no loss beyond what our throughput model
    # charges for running without tensor parallelism): neither Oobleck's paper nor ours gives a
    # measurement against Megatron-LM on these models. Varied in docs/simulation.md's
    # sensitivity table. The pauses are assumptions of the order its mechanism implies.
    "oobleck": {
        "efficiency": 1.0,
        "crash_detection_s": 5.0,
        "hang_detection_s": 60.0,
        "failure_pause_s": 60.0,
        "lost_work": "iteration",
        "rejoin_pause_s": 60.0,
    },
    # Varuna (EuroSys'22): pipeline + data parallelism; morphs the job by restarting from its
    # latest checkpoint with a new configuration. Efficiency: an assumption, 1.0, as Oobleck's
    # (varied in the sensitivity table); the 5 min restart is an assumption too.
    "varuna": {
        "efficiency": 1.0,
        "crash_detection_s": 60.0,
        "hang_detection_s": 60.0,
        "failure_pause_s": 300.0,
        "lost_work": "checkpoint",
        "rejoin_pause_s": 300.0,
    },
    # Bamboo (NSDI'23): redundant computation lets a pipeline fail over without restarting, at
    # the price of the redundant work in every step: a forward pass for the neighbour stage, a
    # third of a step's compute, of which we take three quarters not hidden in bubbles.
    "bamboo": {
        "efficiency": 0.75,
        "crash_detection_s": 5.0,
        "hang_detection_s": 60.0,
        "failure_pause_s": 10.0,
        "lost_work": "none",
        "rejoin_pause_s": 60.0,
    },
    # torchft: per-step quorum; survivors go on after the lighthouse notices, the failed step is
    # dropped, the failed replica group restarts and heals from a peer. Its detection, heal and
    # efficiency are what bench/torchft_recovery.py and bench/overhead_bench.py measured with
    # torchft itself (``measured.py``, written from docs/bench), as docs/simulation.md reports.
    "torchft": {
        "tensor_parallel": True,
        "failure_pause_s": 0.0,
        "lost_work": "iteration",
        "survivors_continue": True,
        "rejoin_pause_s": 0.0,
        **measured.TORCHFT,
    },
}


class ElasticPolicy:
    """A single-job elastic system: it keeps its own task going on what it has, never plans
    across tasks, and takes a free spare when there is one."""

    elastic = True

    def __init__(self, name: str, settings: ElasticSettings) -> None:
        self.name = name
        self.s = settings
        self.efficiency = settings.efficiency
        self.tensor_parallel = settings.tensor_parallel

    def start(self, sim: Simulation) -> None:
        pass

    def _lost_work(self, sim: Simulation, run: TaskRun) -> float:
        if self.s.lost_work == "iteration":
            return iteration_s(sim, run)
        if self.s.lost_work == "checkpoint":
            return self.s.checkpoint_interval_s / 2
        return 0.0

    def on_failure(self, sim: Simulation, failure: Failure, hit: Mapping[str, int]) -> None:
        detect = self.s.crash_detection_s if failure.kind in CRASH_KINDS else self.s.hang_detection_s
        if failure.kind in NOT_A_FAULT:
            return
        numerical = failure.kind in NUMERICAL_KINDS
        if numerical:
            detect = self.s.divergence_detection_s
        node_out = failure.node not in sim.healthy
        for name, lost in hit.items():
            run = sim.tasks[name]
            if self.s.survivors_continue and not numerical:  # (every replica took the wrong sum)
                self._drop_replica_group(sim, run, lost, detect, node_out)
                continue
            lost_work = self.s.checkpoint_interval_s / 2 if numerical else self._lost_work(sim, run)
            restart = self.s.failure_pause_s + (self.s.heal_s if numerical else 0.0)  # (torchft: all heal)
            parts = [(detect, "detection"), (restart, "restart"), (lost_work, "lost_work")]
            sim.pause(name, parts, replace=True)
            size = replaced(sim, run, held(sim, name), lost) if node_out else None
            if size is not None:
                sim.set_allocation(allocation(sim, {name: size}, held))
            elif node_out:
                sim.set_allocation(allocation(sim, {name: run.gpus}, held))

    def _drop_replica_group(
        self, sim: Simulation, run: TaskRun, lost: int, detect: float, node_out: bool
    ) -> None:
        name = run.spec.name
        points = sim.reference[name].evaluate(np.array([run.nominal], dtype=np.int64))
        replica = max(int(points.replica_gpus[0]), 1)
        # The replica group(s) holding the failed workers stop; the other groups go on.
        group = min(run.nominal, math.ceil(lost / replica) * replica)
        # Survivors stall until the quorum drops the failed group; the step in flight is lost.
        # Both cost the whole task; only then does it go on without the failed group.
        stall = detect + self._lost_work(sim, run)
        sim.pause(name, [(detect, "detection"), (stall - detect, "lost_work")], replace=True)
        size = replaced(sim, run, held(sim, name), lost) if node_out else None
        if size is not None:
            sim.set_allocation(allocation(sim, {name: size}, held))
            node_out = False  # the group restarts on a spare node
        effective = max(held(sim, name) + (lost if node_out else 0) - group, 0)

        def drop() -> None:
            run.gpus = min(run.gpus, effective)

        sim.call_at(sim.now + stall, drop)
        if not node_out:
            sim.call_at(sim.now + max(stall, detect + self.s.heal_s), self._healer(sim, name))

    def _healer(self, sim: Simulation, name: str) -> Callable[[], None]:
        return lambda: self._heal(sim, name)

    def _heal(self, sim: Simulation, name: str) -> None:
        sim.tasks[name].gpus = held(sim, name)

    def on_repair(self, sim: Simulation, node: int) -> None:
        for name, run in sorted(sim.tasks.items(), key=lambda kv: kv[0]):
            holds = held(sim, name)
            deficit = run.nominal - holds
            if deficit <= 0 or sim.free_gpus() < deficit:
                continue
            sim.set_allocation(allocation(sim, {name: run.nominal}, held))
            if self.s.survivors_continue:
                run.gpus = holds  # the new group heals before it counts
                sim.call_at(sim.now + self.s.heal_s, self._healer(sim, name))
            else:
                sim.pause(name, [(self.s.rejoin_pause_s, "restart")])


POLICY_NAMES = ("unicron", "megatron", "oobleck", "varuna", "bamboo", "torchft", "oracle")


def make_policy(name: str, overrides: Mapping[str, Any] | None = None) -> Any:
    """Build a policy by name; ``overrides`` are validated against its settings."""
    overrides = dict(overrides or {})
    if name == "unicron":
        return UnicronPolicy(UnicronSettings(**overrides))
    if name == "megatron":
        return MegatronPolicy(MegatronSettings(**overrides))
    if name == "oracle":
        if overrides:
            raise ValueError("the oracle has no settings")
        return OraclePolicy()
    if name in ELASTIC_DEFAULTS:
        return ElasticPolicy(name, ElasticSettings(**{**ELASTIC_DEFAULTS[name], **overrides}))
    raise ValueError(f"unknown policy {name!r}; use one of {', '.join(POLICY_NAMES)}")

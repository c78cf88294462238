"""Policies: how Unicron and each baseline react to failures. Parameters and their sources are
listed in docs/simulation.md; every one can be overridden per scenario (``policy_settings``).

All policies start from the same allocation (the optimal plan for the full cluster), so the
comparison isolates failure handling and re-planning.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from unicron.core.events import NodeBack, NodeLost
from unicron.core.taxonomy import TAXONOMY, Action, ErrorKind
from unicron.planning.placement import Assignment
from unicron.planning.planner import plan
from unicron.planning.transition import bandwidth, state_source, transition_parts
from unicron.sim.engine import HOUR, Simulation, TaskRun
from unicron.sim.traces import Failure

# Kinds whose first symptom is a process that dies or raises (a launcher sees the exit); the
# others first show as peers blocked in a collective, found only by a timeout or by monitoring.
CRASH_KINDS = frozenset(
    {
        ErrorKind.CUDA_ERROR,
        ErrorKind.ILLEGAL_MEMORY_ACCESS,
        ErrorKind.EXITED_ABNORMALLY,
        ErrorKind.ECC_ERROR,
        ErrorKind.CONNECTION_REFUSED,
        ErrorKind.CONNECTION_RESET,
        ErrorKind.OTHER,
    }
)


def _gpus(sim: Simulation, name: str) -> int:
    return sim.tasks[name].gpus


def _allocation(
    sim: Simulation, changes: Mapping[str, int], held: Callable[[Simulation, str], int] = _gpus
) -> dict[str, int]:
    """Every task's GPUs as held now (``held``), with ``changes`` applied."""
    return {**{n: held(sim, n) for n in sim.tasks}, **changes}


class _Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _iteration_s(sim: Simulation, run: TaskRun) -> float:
    points = sim.reference[run.spec.name].evaluate(np.array([max(run.gpus, run.nominal)], dtype=np.int64))
    value = float(points.iteration_s[0])
    return value if math.isfinite(value) else 0.0


# ---------------------------------------------------------------------------------- Unicron


class UnicronSettings(_Settings):
    node_lost_detection_s: float = Field(3.0, ge=0, description="heartbeat deadline")
    crash_detection_s: float = Field(0.5, ge=0, description="process exit or forwarded exception")
    hardware_detection_s: float = Field(1.0, ge=0, description="NVLink, driver, DMA errors raised in-band")
    network_detection_s: float = Field(1.0, ge=0, description="socket errors raised in-band")
    hang_multiple: float = Field(3.0, gt=1, description="hang deadline in mean iteration times")
    heartbeat_s: float = Field(1.0, ge=0)
    reattempt_failure_probability: float = Field(0.1, ge=0, le=1)
    isolate_after: int = Field(3, ge=1, description="SEV1/SEV2 errors on one node within the window")
    isolate_window_hours: float = Field(24.0, gt=0)
    isolation_hours: float = Field(24.0, ge=0, description="how long an isolated node is checked")
    seed: int = 0


class UnicronPolicy:
    name = "unicron"
    efficiency = 1.0  # the paper: failure-free throughput equal to Megatron's
    tensor_parallel = True
    elastic = False

    def __init__(self, settings: UnicronSettings | None = None) -> None:
        self.s = settings or UnicronSettings()
        self.rng = random.Random(self.s.seed)
        self.errors: dict[int, list[float]] = {}

    def start(self, sim: Simulation) -> None:
        pass

    def detection_s(self, sim: Simulation, kind: ErrorKind, run: TaskRun | None) -> float:
        if kind is ErrorKind.NODE_LOST:
            return self.s.node_lost_detection_s
        if kind in (ErrorKind.TASK_HANG, ErrorKind.NCCL_TIMEOUT):
            iteration = _iteration_s(sim, run) if run is not None else 0.0
            return self.s.hang_multiple * iteration + self.s.heartbeat_s
        if kind in CRASH_KINDS:
            return self.s.crash_detection_s
        if TAXONOMY[kind].action is Action.RECONFIGURE:
            return self.s.hardware_detection_s
        return self.s.network_detection_s

    def on_failure(self, sim: Simulation, failure: Failure, hit: Mapping[str, int]) -> None:
        action = TAXONOMY[failure.kind].action
        if action is Action.REATTEMPT and self.rng.random() < self.s.reattempt_failure_probability:
            action = Action.RESTART_PROCESS  # the retried operation failed again: escalate
        if action is Action.RESTART_PROCESS and self._flaky(sim, failure.node):
            action = Action.RECONFIGURE
            sim.take_out(failure.node, sim.now + self.s.isolation_hours * HOUR)
        if action is Action.RECONFIGURE:
            self._reconfigure(sim, failure, hit)
            return
        settings = sim.cluster.planner.transition
        for name in hit:
            run = sim.tasks[name]
            detect = self.detection_s(sim, failure.kind, run)
            if action is Action.REATTEMPT:
                sim.pause(name, [(detect, "detection"), (settings.reattempt_s, "restart")])
                continue
            # Restart the failed process; it takes its state from the nearest live replica.
            points = sim.reference[name].evaluate(np.array([run.gpus], dtype=np.int64))
            replica = int(points.replica_gpus[0])
            source = state_source(run.gpus - hit[name], replica)
            move = float(points.state_bytes_per_gpu[0]) / bandwidth(settings, source)
            lost = settings.lost_iteration_fraction * _iteration_s(sim, run)
            if source.value == "persistent_checkpoint":
                lost += settings.checkpoint_interval_s / 2
            sim.pause(
                name,
                [(detect, "detection"), (settings.restart_process_s + move, "restart"), (lost, "lost_work")],
            )

    def _flaky(self, sim: Simulation, node: int) -> bool:
        window = self.s.isolate_window_hours * HOUR
        recent = [t for t in self.errors.get(node, []) if sim.now - t <= window] + [sim.now]
        self.errors[node] = recent
        return len(recent) >= self.s.isolate_after

    def _reconfigure(self, sim: Simulation, failure: Failure, hit: Mapping[str, int]) -> None:
        node = failure.node
        before: Assignment = {n: dict(t) for n, t in sim.assignment.items()}
        before[node] = dict(hit)
        state = sim.planner_state(tuple(sorted(sim.healthy | {node})), before)
        if node in sim.healthy:  # a SEV1 kind that needs no repair: the node returns at once
            sim.take_out(node, sim.now)
        chosen = plan(state, NodeLost(node))
        self._carry_out(sim, chosen.decisions, hit, failure.kind)

    def _carry_out(
        self, sim: Simulation, decisions: Any, hit: Mapping[str, int], kind: ErrorKind | None
    ) -> None:
        settings = sim.cluster.planner.transition
        for d in decisions:
            failed = d.task in hit
            if d.after == d.before and not failed:
                continue
            run = sim.tasks[d.task]
            curve = sim.reference[d.task]
            before = curve.evaluate(np.array([d.before], dtype=np.int64))
            after = curve.evaluate(np.array([d.after], dtype=np.int64))
            detect = self.detection_s(sim, kind, run) if (failed and kind is not None) else 0.0
            parts = transition_parts(
                settings,
                before=before,
                after=after,
                survivors=d.before - hit.get(d.task, 0),
                failed=failed,
                detection_s=detect,
            )
            if d.after > 0:
                sim.pause(
                    d.task,
                    [
                        (float(parts.detection[0]), "detection"),
                        (float(parts.setup[0] + parts.state[0]), "restart"),
                        (float(parts.lost_work[0]), "lost_work"),
                    ],
                )
        sim.set_allocation({d.task: d.after for d in decisions})

    def on_repair(self, sim: Simulation, node: int) -> None:
        state = sim.planner_state(tuple(sorted(sim.healthy - {node})))
        chosen = plan(state, NodeBack(node))
        self._carry_out(sim, chosen.decisions, {}, None)


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


class MegatronSettings(_Settings):
    collective_timeout_s: float = Field(1800.0, ge=0, description="NCCL/gloo timeout seen by peers")
    exit_detection_s: float = Field(60.0, ge=0, description="job fails once a rank exits")
    resubmit_s: float = Field(540.0, ge=0, description="waiting for the job to be rescheduled")
    setup_s: float = Field(840.0, ge=0, description="start-up, initialisation, checkpoint load")
    checkpoint_interval_s: float = Field(1800.0, gt=0)
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
        detect = self.s.exit_detection_s if failure.kind in CRASH_KINDS else self.s.collective_timeout_s
        node_out = failure.node not in sim.healthy
        for name, lost in hit.items():
            run = sim.tasks[name]
            if not node_out:
                sim.pause(name, [(detect, "detection"), *self._restart()])
                continue
            survivors = run.gpus  # the engine already removed the lost workers
            if sim.free_gpus() >= lost:  # a spare takes the lost node's place
                sim.set_allocation(_allocation(sim, {name: run.nominal}))
                sim.pause(name, [(detect, "detection"), *self._restart()])
            elif self.s.on_node_loss == "shrink":
                budget = survivors + sim.free_gpus()
                smaller = max((c for c in range(budget, 0, -1) if sim.usable(name, c)), default=0)
                sim.set_allocation(_allocation(sim, {name: smaller}))
                sim.pause(name, [(detect, "detection"), *self._restart()])
            else:
                run.waiting_rate = sim.potential(run, run.nominal) * survivors / max(run.nominal, 1)
                sim.pause(name, [(detect, "detection"), (math.inf, "repair_wait")])

    def on_repair(self, sim: Simulation, node: int) -> None:
        for name, run in sorted(sim.tasks.items(), key=lambda kv: kv[1].gpus - kv[1].nominal):
            deficit = run.nominal - run.gpus
            if deficit <= 0 or sim.free_gpus() < deficit:
                continue
            waiting = any(c == "repair_wait" for _, c in run.segments)
            sim.set_allocation(_allocation(sim, {name: run.nominal}))
            run.waiting_rate = None if not waiting else run.waiting_rate
            # A waiting task restarts from its checkpoint; a shrunk one checkpoints, then restarts.
            sim.pause(name, self._restart(with_recompute=waiting), replace=waiting)


# ---------------------------------------------------------------------------------- elastic baselines


class ElasticSettings(_Settings):
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
    # dropped, the failed replica group restarts and heals from a peer.
    "torchft": {
        "tensor_parallel": True,
        "crash_detection_s": 2.0,
        "hang_detection_s": 60.0,
        "failure_pause_s": 0.0,
        "lost_work": "iteration",
        "survivors_continue": True,
        "heal_s": 30.0,
        "rejoin_pause_s": 0.0,
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
            return _iteration_s(sim, run)
        if self.s.lost_work == "checkpoint":
            return self.s.checkpoint_interval_s / 2
        return 0.0

    def on_failure(self, sim: Simulation, failure: Failure, hit: Mapping[str, int]) -> None:
        detect = self.s.crash_detection_s if failure.kind in CRASH_KINDS else self.s.hang_detection_s
        node_out = failure.node not in sim.healthy
        for name, lost in hit.items():
            run = sim.tasks[name]
            if self.s.survivors_continue:
                self._drop_replica_group(sim, run, lost, detect, node_out)
                continue
            sim.pause(
                name,
                [
                    (detect, "detection"),
                    (self.s.failure_pause_s, "restart"),
                    (self._lost_work(sim, run), "lost_work"),
                ],
            )
            if node_out and sim.free_gpus() >= lost:
                sim.set_allocation(_allocation(sim, {name: run.nominal}, self._held))
            elif node_out:
                sim.set_allocation(_allocation(sim, {name: run.gpus}, self._held))

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
        sim.pause(name, [(detect, "detection"), (stall - detect, "lost_work")])
        if node_out and sim.free_gpus() >= lost:
            sim.set_allocation(_allocation(sim, {name: run.nominal}, self._held))
            node_out = False  # the group restarts on a spare node
        effective = max(self._held(sim, name) + (lost if node_out else 0) - group, 0)

        def drop() -> None:
            run.gpus = min(run.gpus, effective)

        sim.call_at(sim.now + stall, drop)
        if not node_out:
            sim.call_at(sim.now + max(stall, detect + self.s.heal_s), self._healer(sim, name))

    @staticmethod
    def _held(sim: Simulation, name: str) -> int:
        return sum(t.get(name, 0) for t in sim.assignment.values())

    def _healer(self, sim: Simulation, name: str) -> Callable[[], None]:
        return lambda: self._heal(sim, name)

    def _heal(self, sim: Simulation, name: str) -> None:
        sim.tasks[name].gpus = self._held(sim, name)

    def on_repair(self, sim: Simulation, node: int) -> None:
        for name, run in sorted(sim.tasks.items(), key=lambda kv: kv[0]):
            held = self._held(sim, name)
            deficit = run.nominal - held
            if deficit <= 0 or sim.free_gpus() < deficit:
                continue
            sim.set_allocation(_allocation(sim, {name: run.nominal}, self._held))
            if self.s.survivors_continue:
                run.gpus = held  # the new group heals before it counts
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

"""What the simulated policies share: their settings base, which failures show as a crash, and a
task's iteration time."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import numpy as np
from pydantic import BaseModel, ConfigDict

from unicron.core.taxonomy import ErrorKind
from unicron.sim.engine import Simulation, TaskRun

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


# Wrong numbers (issue 55): no process fails and no collective blocks. Unicron's test of the step's
# gradient sum finds them in the step they strike (``train/numerics.py``); a system without one
# finds them only once the loss diverges, and must then restart from a checkpoint saved before
# them, since the wrong sum reached every replica (a peer's state is as wrong as the failed one's).
NUMERICAL_KINDS = frozenset(
    {
        ErrorKind.SILENT_DATA_CORRUPTION,
        ErrorKind.NUMERICAL_TRANSIENT,
        ErrorKind.NUMERICAL_DATA,
        ErrorKind.NUMERICAL_SKIPPED,
        ErrorKind.REPLICA_REPAIRED,  # (a replica's state gone odd: its gradients in every sum since)
        ErrorKind.REPLICAS_DIVERGED,
    }
)
# A spike in the gradient norm that the data gives: a system without the test applies it too.
NOT_A_FAULT = frozenset({ErrorKind.GRADIENT_SPIKE})
DIVERGENCE_DOC = (
    "wrong numbers (silent data corruption) found only when the loss diverges, then a restart from "
    "the checkpoint before them: an assumption (an hour; no published figure)"
)


class PolicySettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def gpus_of(sim: Simulation, name: str) -> int:
    return sim.tasks[name].gpus


def held(sim: Simulation, name: str) -> int:
    """GPUs the task holds in the placement (its running count may be lower while newcomers
    start or a failed group heals)."""
    return sim.held(name)


def allocation(
    sim: Simulation, changes: Mapping[str, int], held: Callable[[Simulation, str], int] = gpus_of
) -> dict[str, int]:
    """Every task's GPUs as held now (``held``), with ``changes`` applied."""
    return {**{n: held(sim, n) for n in sim.tasks}, **changes}


def iteration_s(sim: Simulation, run: TaskRun) -> float:
    points = sim.reference[run.spec.name].evaluate(np.array([max(run.gpus, run.nominal)], dtype=np.int64))
    value = float(points.iteration_s[0])
    return value if math.isfinite(value) else 0.0


def replaced(sim: Simulation, run: TaskRun, holds: int, lost: int) -> int | None:
    """The GPUs a task that lost ``lost`` and holds ``holds`` runs on once free GPUs (a spare
    node) take the lost ones' place: its planned size where enough are free, else its size
    before the loss (it may have run below its plan since an earlier loss); None where fewer
    than ``lost`` are free."""
    free = sim.free_gpus()
    if free >= run.nominal - holds:
        return run.nominal
    return holds + lost if free >= lost else None

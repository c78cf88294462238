"""The soak's plan, a pure function of its seed: which tasks run, which faults their workers
inject (the fault library, at random steps), and which faults hit the cluster from outside, when,
and where. The same seed gives the same plan; what a fault finds to strike (which workers are
running at that moment) depends on the run, so targets are drawn as indices into the sorted
candidates.

A covering plan (``covering=True``, the short soak of ``make test``) strikes every kind of
``CLUSTER_FAULTS`` before any repeats (a seeded order; a kind that found nothing to strike is
tried again later), and deals every kind of ``WORKER_FAULTS`` to the first tasks before any
repeats (a kind dealt to a task that ended before it struck is dealt again to a later task:
a task restarted while the store that claims faults was down, or failed, never reached it), so
that a minute's soak still meets every fault."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

# Faults injected from outside the workers, by the soak (bench/chaos/inject.py).
CLUSTER_FAULTS = (
    "worker_kill",  # SIGKILL a running worker
    "worker_hang",  # SIGSTOP a running worker: a hang, found by the iteration-time statistics
    "node_freeze",  # SIGSTOP a node's agent and workers (power or network gone), then it returns
    "node_loss",  # SIGKILL a node's agent and workers, then it returns
    "agent_kill",  # SIGKILL a node's agent (its workers die with it), restarted at once
    "coordinator_kill",  # kill -9 the coordinator, restarted after a pause
    "checkpoint_corrupt",  # truncate a task's newest persistent checkpoint
)
# Faults the workers inject themselves (unicron.train.faults), once per task (generation 0).
WORKER_FAULTS = ("raise", "kill_after_reduce", "kill_in_backward", "hang", "stall_before_reduce")
WEIGHTS = (1.0, 2.0, 3.0)  # three tasks of different weights
ITERATIONS = 60  # the steps of every task of the soak


@dataclass(frozen=True)
class Strike:
    """One fault from outside: after ``delay_s``, ``kind`` strikes the ``pick``-th candidate."""

    delay_s: float
    kind: str
    pick: int
    pause_s: float  # how long a lost node or coordinator stays away


@dataclass
class Plan:
    seed: int
    iterations: int
    covering: bool = False  # every kind of fault first (see the module's docstring)
    pause_s: tuple[float, float] = (1.0, 8.0)  # how long a lost node or coordinator stays away
    rng: random.Random = field(init=False)
    unstruck: list[str] = field(init=False)  # covering: the outside kinds still to strike, in turn
    undealt: list[str] = field(init=False)  # covering: the worker faults still to deal, in turn

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        order = random.Random(f"{self.seed}-covering")  # the default plan's draws stay as they were
        self.unstruck = order.sample(CLUSTER_FAULTS, len(CLUSTER_FAULTS)) if self.covering else []
        self.undealt = order.sample(WORKER_FAULTS, len(WORKER_FAULTS)) if self.covering else []

    def worker_faults(self) -> list[dict[str, Any]]:
        """Two faults of the library for a new task, at random steps (rank 0, which every
        world has; generation 0: whichever worker first reaches the step, once)."""
        steps = sorted(self.rng.sample(range(5, self.iterations - 5), 2))
        return [
            {
                "action": self.undealt.pop(0) if self.undealt else self.rng.choice(WORKER_FAULTS),
                "rank": 0,
                "step": s,
                "generation": 0,
                "seconds": 3.0,
                "message": "chaos soak: an injected error",
            }
            for s in steps
        ]

    def next_strike(self, mean_gap_s: float) -> Strike:
        return Strike(
            delay_s=min(3 * mean_gap_s, self.rng.expovariate(1 / mean_gap_s)),
            kind=self.unstruck.pop(0) if self.unstruck else self.rng.choice(CLUSTER_FAULTS),
            pick=self.rng.randrange(1 << 30),
            pause_s=self.rng.uniform(*self.pause_s),
        )

    def missed(self, kind: str) -> None:
        """``kind`` found nothing to strike (no running worker, no checkpoint yet): a covering
        plan strikes it again after the kinds still waiting."""
        if self.covering and kind not in self.unstruck:
            self.unstruck.append(kind)

    def undelivered(self, actions: set[str]) -> None:
        """Worker faults dealt to a task that ended without striking them: a covering plan deals
        them again, before any repeats."""
        if self.covering:
            self.undealt.extend(sorted(actions - set(self.undealt)))

    @property
    def covered(self) -> bool:
        """Whether every outside kind has struck (a covering plan; always true otherwise)."""
        return not self.unstruck

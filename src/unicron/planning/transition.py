"""The transition-time model D_trans: how long a task produces nothing while it changes.

D_trans = detection + set-up of the action + state movement + lost work, where

- detection: the in-band detection delay of the failure that hit the task (0 for a task that
  only changes because the plan moved it: the coordinator itself orders that change);
- set-up: per recovery tier (``core/tiers.py``): process start, rendezvous and process-group
  rebuild;
- state movement: bytes each new or re-sharded worker needs (model + optimizer state of its
  shard) divided by the bandwidth of the nearest source that still holds them;
- lost work: with partial-result reuse, a fraction of one iteration; when no live replica
  survives, the work since the last persistent checkpoint (half the interval on average).

Every number comes from :class:`~unicron.core.specs.TransitionSettings`; docs/cost-model.md
lists the defaults and where they come from. Functions are vectorised over candidate counts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from unicron.core.specs import TransitionSettings
from unicron.core.taxonomy import StateSource
from unicron.core.tiers import Tier
from unicron.planning.throughput import CurvePoints, FloatArray

GB = 1e9


def setup_seconds(settings: TransitionSettings, tier: Tier) -> float:
    """A tier's set-up: a relaunch from the checkpoint starts its processes as a process restart
    does (its state is priced apart, from the checkpoint's bandwidth)."""
    return {
        Tier.REATTEMPT: settings.reattempt_s,
        Tier.RESTART_FAILED: settings.restart_process_s,
        Tier.RECONFIGURE: settings.reconfigure_s,
        Tier.FROM_CHECKPOINT: settings.restart_process_s,
    }[tier]


def bandwidth(settings: TransitionSettings, source: StateSource) -> float:
    """Bytes per second from a state source to one receiving worker."""
    return (
        GB
        * {
            StateSource.LOCAL: np.inf,
            StateSource.SAME_NODE_REPLICA: settings.same_node_replica_gbytes_per_s,
            StateSource.OTHER_NODE_REPLICA: settings.other_node_replica_gbytes_per_s,
            StateSource.HOST_MEMORY_CHECKPOINT: settings.host_memory_checkpoint_gbytes_per_s,
            StateSource.PERSISTENT_CHECKPOINT: settings.persistent_checkpoint_gbytes_per_s,
        }[source]
    )


def state_source(survivors: int, replica_gpus: int) -> StateSource:
    """Nearest source for a task whose surviving workers number ``survivors``.

    The planner does not see which ranks survived; it assumes a full model copy survives when the
    survivors number at least one replica's worth of GPUs, and that it sits on another node.
    """
    if survivors > 0 and replica_gpus > 0 and survivors >= replica_gpus:
        return StateSource.OTHER_NODE_REPLICA
    return StateSource.PERSISTENT_CHECKPOINT


@dataclass(frozen=True)
class TransitionParts:
    """D_trans split by cause, each an array over the candidate counts."""

    detection: FloatArray
    setup: FloatArray
    state: FloatArray
    lost_work: FloatArray

    @property
    def total(self) -> FloatArray:
        return np.asarray(self.detection + self.setup + self.state + self.lost_work)


def transition_parts(
    settings: TransitionSettings,
    *,
    before: CurvePoints,
    after: CurvePoints,
    survivors: int,
    failed: bool,
    detection_s: float,
    tier: Tier = Tier.RECONFIGURE,
) -> TransitionParts:
    """D_trans for moving a task from ``before`` (one count) to each count in ``after``.

    ``before`` is the curve at the task's current count (arrays of length 1); ``survivors`` is
    how many of its workers are still alive after the event.
    """
    replica_before = int(before.replica_gpus[0])
    source = state_source(survivors, replica_before)
    # Workers that did not hold their new shard: newcomers, and everyone if the layout changes.
    needs_state = (after.gpus > survivors) | (after.replica_gpus != replica_before)
    moving = np.where(needs_state, after.state_bytes_per_gpu / bandwidth(settings, source), 0.0)
    lost = 0.0
    if failed:
        iteration = float(before.iteration_s[0])
        lost = settings.lost_iteration_fraction * (iteration if np.isfinite(iteration) else 0.0)
        if source is StateSource.PERSISTENT_CHECKPOINT:
            lost += settings.checkpoint_interval_s / 2
    ones = np.ones(len(after.gpus))
    return TransitionParts(
        ones * (detection_s if failed else 0.0),
        ones * setup_seconds(settings, tier),
        np.asarray(moving, dtype=np.float64),
        ones * lost,
    )

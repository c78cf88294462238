"""The error taxonomy: kinds of failure, their severity, and the tier that first handles each.

Severities and first tiers follow the Unicron paper (arXiv 2401.00134, section 4, Figure 1;
docs/reliability.md). Tiers are ordered cheapest first; escalation moves up that order.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum, StrEnum

from unicron.core.tiers import Tier


class Severity(IntEnum):
    SEV1 = 1  # hardware that needs repair: the node must be isolated
    SEV2 = 2  # a process is broken: replace it
    SEV3 = 3  # transient: retry in place


class Scope(StrEnum):
    """What a fault belongs to, and so what it may be counted against. Only worker and node
    faults count against a node (towards its isolation): isolating healthy nodes for a task's
    own bug or for a full checkpoint disk would idle the cluster and fix nothing."""

    WORKER = "worker"  # one process (a crash, a CUDA error): counts against its node
    NODE = "node"  # the machine (ECC, NVLink, driver, lost)
    TASK = "task"  # the task itself (its program, its data; every rank failing alike)
    STORAGE = "storage"  # the checkpoint storage (full, read-only, corrupt)


class StateSource(StrEnum):
    """Where a new or restarted worker takes its state from, nearest first."""

    LOCAL = "local"  # its own memory: nothing moves
    SAME_NODE_REPLICA = "same_node_replica"
    OTHER_NODE_REPLICA = "other_node_replica"
    HOST_MEMORY_CHECKPOINT = "host_memory_checkpoint"
    PERSISTENT_CHECKPOINT = "persistent_checkpoint"


class ErrorKind(StrEnum):
    NODE_LOST = "node_lost"
    NODE_PARTITIONED = "node_partitioned"  # it reaches the coordinator but not its peers
    ECC_ERROR = "ecc_error"
    NVLINK_ERROR = "nvlink_error"
    GPU_DRIVER_ERROR = "gpu_driver_error"
    INVALID_DMA_MAPPING = "invalid_dma_mapping"
    CUDA_ERROR = "cuda_error"
    ILLEGAL_MEMORY_ACCESS = "illegal_memory_access"
    TASK_HANG = "task_hang"
    EXITED_ABNORMALLY = "exited_abnormally"
    NCCL_TIMEOUT = "nccl_timeout"
    LINK_FLAPPING = "link_flapping"
    CONNECTION_REFUSED = "connection_refused"
    CONNECTION_RESET = "connection_reset"
    OTHER_NETWORK_ERROR = "other_network_error"
    OUT_OF_MEMORY = "out_of_memory"
    STORAGE_ERROR = "storage_error"
    # Wrong numbers, found in the step (``train/numerics.py``: a gradient sum not finite, or a
    # spike in its norm): a device whose gradients are wrong for samples another device computes
    # right; samples wrong wherever computed.
    SILENT_DATA_CORRUPTION = "silent_data_corruption"
    NUMERICAL_DATA = "numerical_data"
    NUMERICAL_TRANSIENT = "numerical_transient"  # wrong once, right computed again
    NUMERICAL_SKIPPED = "numerical_skipped"  # the data's, and the task skips it (run.on_bad_data)
    GRADIENT_SPIKE = "gradient_spike"  # a spike the data gives wherever computed: applied
    # A replica's state unlike its peers' (``train/replicacheck.py``: a bit flipped in its memory,
    # an update computed wrong): given the others' in place where nothing computed from it was
    # applied; else the task goes back to its newest checkpoint, which was checked.
    REPLICA_REPAIRED = "replica_repaired"
    REPLICAS_DIVERGED = "replicas_diverged"
    USER_ERROR = "user_error"
    OTHER = "other"


def error_kind(value: str) -> ErrorKind:
    """A reported or recorded classification; one this version does not know counts as ``other``."""
    try:
        return ErrorKind(value)
    except ValueError:
        return ErrorKind.OTHER


@dataclass(frozen=True)
class KindInfo:
    severity: Severity
    tier: Tier  # the first tier that handles it (core/tiers.py; the ladder may escalate)
    needs_repair: bool  # the node stays unusable until repaired
    scope: Scope = Scope.WORKER


_S1 = KindInfo(Severity.SEV1, Tier.RECONFIGURE, True, Scope.NODE)
_S2 = KindInfo(Severity.SEV2, Tier.RESTART_FAILED, False)
_S3 = KindInfo(Severity.SEV3, Tier.REATTEMPT, False)

TAXONOMY: dict[ErrorKind, KindInfo] = {
    ErrorKind.NODE_LOST: _S1,
    # Not in the paper's table: a host its peers cannot reach (found by the agents' peer probe
    # after a hang no rank is to blame for). Taken out like a lost node, for the isolation
    # period, but not awaiting repair: a network that heals brings it back.
    ErrorKind.NODE_PARTITIONED: KindInfo(Severity.SEV1, Tier.RECONFIGURE, False, Scope.NODE),
    ErrorKind.ECC_ERROR: _S1,
    ErrorKind.NVLINK_ERROR: _S1,
    ErrorKind.GPU_DRIVER_ERROR: _S1,
    ErrorKind.INVALID_DMA_MAPPING: _S1,
    ErrorKind.CUDA_ERROR: _S2,
    ErrorKind.ILLEGAL_MEMORY_ACCESS: _S2,
    ErrorKind.TASK_HANG: _S2,
    ErrorKind.EXITED_ABNORMALLY: _S2,
    ErrorKind.NCCL_TIMEOUT: _S3,
    ErrorKind.LINK_FLAPPING: _S3,
    ErrorKind.CONNECTION_REFUSED: _S3,
    ErrorKind.CONNECTION_RESET: _S3,
    ErrorKind.OTHER_NETWORK_ERROR: _S3,
    # Not in the paper's table. Restarting cannot fix a bug or a model that does not fit, but it
    # is the cheapest thing that might; repeats make the task fail (Settings.task_failure_limit).
    ErrorKind.OUT_OF_MEMORY: _S2,
    ErrorKind.USER_ERROR: KindInfo(Severity.SEV2, Tier.RESTART_FAILED, False, Scope.TASK),
    # A full, read-only or corrupt checkpoint store: restarting processes cannot mend it, and no
    # node is to blame; repeats fail the task with the reason (Settings.same_fault_limit).
    ErrorKind.STORAGE_ERROR: KindInfo(Severity.SEV2, Tier.RESTART_FAILED, False, Scope.STORAGE),
    # Not in the paper's table (issue 55). A device that computes wrong values is isolated until
    # an operator resumes it (``brain/response.py:UNTIL_RESUMED``); its peers go on in place. Data
    # that gives NaN, Inf or a spike wherever it is computed fails the task with the verdict at
    # once: a restart or another device would compute the same (Megatron's rerun machine exits
    # likewise).
    ErrorKind.SILENT_DATA_CORRUPTION: _S1,
    ErrorKind.NUMERICAL_DATA: KindInfo(Severity.SEV2, Tier.FAIL_TASK, False, Scope.TASK),
    # Found and undone inside the step by the ranks themselves (the step computed again in place:
    # no process restarts), and reported as done (``NumericalReport``): never raised.
    ErrorKind.NUMERICAL_TRANSIENT: _S3,
    # Data at fault in a task that skips it: the step's update skipped in place, its samples
    # recorded as skipped (``run.on_bad_data: skip``); reported as done, never raised.
    ErrorKind.NUMERICAL_SKIPPED: KindInfo(Severity.SEV3, Tier.REATTEMPT, False, Scope.TASK),
    # A spike in the gradient norm that every computation gives: the data's, applied as training
    # without the test would apply it; recorded, so that a run's spikes are seen.
    ErrorKind.GRADIENT_SPIKE: KindInfo(Severity.SEV3, Tier.REATTEMPT, False, Scope.TASK),
    # A replica whose state alone differed, mended in place from the majority's before anything
    # computed from it was applied (no process restarts); reported as done, never raised.
    ErrorKind.REPLICA_REPAIRED: _S3,
    # Replicas that differ where no majority tells which is right, or where steps went by since
    # they were last alike (the odd one's gradients may be in every replica's sum since): no live
    # state is trusted, and the newest checkpoint is (one is written only once the replicas agree).
    ErrorKind.REPLICAS_DIVERGED: KindInfo(Severity.SEV2, Tier.FROM_CHECKPOINT, False, Scope.TASK),
    # The paper leaves "others" unassigned; we restart the process, the middle of the ladder.
    ErrorKind.OTHER: _S2,
}

"""Every threshold of detection and handling, in one place, with the ordering of all timeouts.

The ordering, checked whenever settings are built (so at start-up), and why it must hold:

    heartbeat_interval_s  <  heartbeat_deadline_s      a deadline must span several heartbeats
    failure_stop_grace_s  <= stop_grace_s              a failed generation is stopped faster
    hang_floor_s          <= hang_cap_s                the hang deadline's bounds
    heartbeat_deadline_s  <  hang_cap_s                node loss is decided before a hang
    heartbeat_deadline_s  <  membership_timeout_s      survivors outwait a node-loss verdict
    heartbeat_deadline_s  <  recovery_deadline_s       node loss is known before a recovery is given up
    recovery_deadline_s   <  membership_timeout_s      a stuck recovery escalates before survivors quit
    stop_grace_s          <= restart_stop_wait_s       a stop gets its grace before slots are reused
    hang_cap_s            <  process_group_timeout_s   Unicron sees a hang before the collective
                                                       times out (else the timeout decides)
    heartbeat_deadline_s  <  first_step_timeout_s      node loss is decided before a first step hangs
    first_step_timeout_s  <  process_group_timeout_s   as hang_cap_s, for a launch's first step
    heartbeat_deadline_s  <  start_timeout_s           node loss is decided before a start is stuck
    start_timeout_s       <  process_group_timeout_s   the ranks that started wait for the others
                                                       in the group's rendezvous under that timeout
    network_grace_s       <  process_group_timeout_s   a slow network's grace ends before gloo gives up
    heartbeat_deadline_s  <  forget_lost_node_s        a node is forgotten only after it is lost
    heartbeat_deadline_s  <  mass_silence_hold_s       a mass silence is held longer than a deadline
    mass_silence_hold_s   <  membership_timeout_s      survivors still wait when a held silence is judged
    process_group_timeout_s < launch_timeout_s ... is not required: they measure different things.

The hang deadline of a task is clamp(hang_multiple x mean recent iteration, floor, cap) once
hang_warmup_steps step times are known, and the cap before (a rank hung in a task's first steps
is found too, later); a step is late once that much time has passed since the previous
step ended (worker clocks), or since a rank was last seen saving that step's checkpoint (up to
checkpoint_allowance_s after the step's end), and one heartbeat more has passed for its report to
arrive; a straggler is a rank whose compute time stays above
straggler_ratio x the median of its peers for straggler_window steps (and
stays one until it has kept within that for as many steps).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from unicron.core.limits import MAX_SECONDS
from unicron.core.specs import FIX_MARK

# (lower, higher, equal allowed, why): the ordering of timeouts checked at start-up.
ORDERING: tuple[tuple[str, str, bool, str], ...] = (
    (
        "heartbeat_interval_s",
        "heartbeat_deadline_s",
        False,
        "a deadline must span several heartbeats",
    ),
    ("failure_stop_grace_s", "stop_grace_s", True, "a failed generation is stopped at least as fast"),
    ("hang_floor_s", "hang_cap_s", True, "the floor of the hang deadline cannot exceed its cap"),
    ("heartbeat_deadline_s", "hang_cap_s", False, "node loss must be decided before a hang"),
    (
        "heartbeat_deadline_s",
        "membership_timeout_s",
        False,
        "survivors must wait longer than it takes to declare a silent node lost",
    ),
    ("stop_grace_s", "restart_stop_wait_s", True, "a stop must be allowed its grace period"),
    (
        "heartbeat_deadline_s",
        "recovery_deadline_s",
        False,
        "a node lost during a recovery must be known before the recovery is given up",
    ),
    (
        "recovery_deadline_s",
        "membership_timeout_s",
        False,
        "a stuck recovery must be escalated before the survivors stop waiting for a membership",
    ),
    (
        "hang_cap_s",
        "process_group_timeout_s",
        False,
        "a hang must be detected before the collective times out",
    ),
    ("heartbeat_deadline_s", "first_step_timeout_s", False, "node loss must be decided before a hang"),
    ("heartbeat_deadline_s", "start_timeout_s", False, "node loss must be decided before a stuck start"),
    (
        "start_timeout_s",
        "process_group_timeout_s",
        False,
        "the ranks that started wait for the others in the group's rendezvous under the group's timeout",
    ),
    (
        "first_step_timeout_s",
        "process_group_timeout_s",
        False,
        "a first step that hangs must be detected before its collective times out",
    ),
    (
        "network_grace_s",
        "process_group_timeout_s",
        False,
        "a slow network's grace must end before the collective times out",
    ),
    ("heartbeat_deadline_s", "forget_lost_node_s", False, "a node is forgotten only after it is lost"),
    (
        "heartbeat_deadline_s",
        "mass_silence_hold_s",
        False,
        "a mass silence is held for longer than one deadline, or it holds nothing",
    ),
    (
        "mass_silence_hold_s",
        "membership_timeout_s",
        False,
        "survivors must still be waiting for a membership when a held silence is judged",
    ),
)


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # node health
    heartbeat_interval_s: float = Field(0.5, gt=0, description="agent heartbeat period")
    heartbeat_deadline_s: float = Field(
        2.5,
        gt=0,
        description="silence after which a node is lost (not counting the coordinator's own lateness"
        " since it was last heard: control/detect/silence.py)",
    )
    heartbeat_rate_max: float = Field(
        1000.0,
        gt=0,
        description="heartbeats a second the coordinator asks for at most: past heartbeat_rate_max x"
        " heartbeat_interval_s nodes the interval and the deadline grow with the node count, up to"
        " 0.75 of the shortest setting a loss must come before (core/cadence.py; about half a core of"
        " this machine's coordinator with the agents' long polls: docs/scale.md)",
    )
    mass_silence_share: float = Field(
        0.55,
        gt=0,
        le=1,
        description="more than this share of the nodes in service silent at once is a mass silence"
        " (the coordinator's or the network's fault, not the nodes'): nobody is declared lost, an alarm"
        " is raised (Kubernetes' --unhealthy-zone-threshold default)",
    )
    mass_silence_min_nodes: int = Field(
        3,
        ge=2,
        le=1_000_000,
        description="... when at least this many are silent (Kubernetes: more than two), or all of them",
    )
    mass_silence_hold_s: float = Field(
        30.0,
        gt=0,
        description="a mass silence longer than this is taken as real: its nodes are judged one by one"
        " again (at node_loss_rate_per_s); no task trains through it anyway",
    )
    node_loss_burst: int = Field(
        32,
        ge=1,
        le=1_000_000,
        description="node losses declared at once at most (a rack's or a leaf switch's worth), then at"
        " node_loss_rate_per_s: a coordinator that misjudges many nodes takes them away slowly",
    )
    node_loss_rate_per_s: float = Field(
        1.0,
        gt=0,
        description="node losses declared per second once the burst is spent (Kubernetes'"
        " --node-eviction-rate is 0.1 for evictions after minutes; a training node's loss must be acted"
        " on in seconds)",
    )
    # statistical monitoring
    hang_multiple: float = Field(3.0, gt=1, description="k: a step running past k x the recent mean hangs")
    hang_warmup_steps: int = Field(
        5, ge=1, description="step times before the hang deadline follows them (until then: hang_cap_s)"
    )
    hang_window: int = Field(20, ge=1, description="recent steps the mean is taken over")
    hang_floor_s: float = Field(
        1.5, gt=0, description="the hang deadline is never shorter (3 x a 0.5 s step: see docs/detection.md)"
    )
    checkpoint_allowance_s: float = Field(
        30.0,
        ge=0,
        description=(
            "how long a checkpoint save seen in progress (a rank's position) holds off"
            " the next step's hang deadline"
        ),
    )
    hang_cap_s: float = Field(
        300.0,
        gt=0,
        description="the hang deadline is never longer; past its last step, a task's workers exit within it",
    )
    network_grace_s: float = Field(
        10.0,
        ge=0,
        description="a hang where every rank waits in a collective while every node reaches every"
        " other waits this much longer, once per step, or again while a worker's TCP connection waits"
        " on a retransmission (network_grace_renewals times at most): a lossy network is slow, not"
        " broken, and a restart would not mend it; past its grace, the step is reattempted in place",
    )
    network_grace_renewals: int = Field(
        3,
        ge=0,
        le=100,
        description="how often a late step's grace is renewed while retransmissions are seen; with the"
        " defaults the step then waited ~50 s, which a lost segment's backoff (0.2 s doubling) reaches"
        " only after 8 failed tries in a row; past that a reattempt in place (fresh connections, their"
        " backoff reset) is faster than waiting on",
    )
    straggler_ratio: float = Field(1.5, gt=1, description="slower than this x its peers' median")
    straggler_window: int = Field(10, ge=2, description="for this many consecutive steps")
    # workers
    process_group_timeout_s: float = Field(900.0, gt=0, description="torch.distributed timeout")
    stop_grace_s: float = Field(3.0, ge=0, description="SIGTERM to SIGKILL for a planned stop")
    failure_stop_grace_s: float = Field(1.0, ge=0, description="SIGTERM to SIGKILL after a failure")
    launch_timeout_s: float = Field(120.0, gt=0, description="a worker must start within this")
    start_timeout_s: float = Field(
        600.0,
        gt=0,
        description="every worker of a launch must have started its training session (the first"
        " position it reports: Python and torch imported, what the program does before its session)"
        " within this of the launch, else the launch is stuck starting up and is relaunched",
    )
    first_step_timeout_s: float = Field(
        600.0,
        gt=0,
        description="once every worker of a launch has started its training session, its first step"
        " (loading the checkpoint, forming the group, compiling) must end within this, else the"
        " step hangs (the hang deadline needs step times);"
        " a relaunch's within hang_multiple x the longest first step of the task's earlier launches"
        " + checkpoint_allowance_s, if shorter, doubled for each relaunch in a row whose first step"
        " was late",
    )
    membership_timeout_s: float = Field(
        60.0, gt=0, description="a survivor waits this long for the coordinator's next membership"
    )
    cause_grace_s: float = Field(
        1.0, ge=0, description="after the heartbeat deadline, how long peers' errors wait for their cause"
    )
    restart_stop_wait_s: float = Field(
        9.0, ge=0, description="how long a stopping generation may take before its slots are reused"
    )
    recovery_deadline_s: float = Field(
        20.0,
        gt=0,
        description="a recovery in place must regain a step within this, else it escalates one tier"
        " (core/tiers.py)",
    )
    store_reconnect_s: float = Field(
        5.0, gt=0, description="a worker retries an unreachable rendezvous store at most this far apart"
    )
    commit_confirm_s: float = Field(
        5.0,
        gt=0,
        description="a checkpoint is committed once the task's store confirms, within this, that its"
        " writer belongs to the current generation (train/fencing.py); else it is not",
    )
    # the control plane (several coordinators on etcd: control/store/leadership.py)
    leader_ttl_s: float = Field(
        3.0,
        ge=2,
        description="a leading coordinator's etcd lease: a standby takes over within about this much"
        " of the leader's death (etcd's lease granularity is a second)",
    )
    # handling
    escalation_window_s: float = Field(600.0, gt=0, description="repeats are counted within this")
    max_reattempts: int = Field(
        2, ge=0, description="reattempts carried out before a failure restarts the failed processes"
    )
    max_restarts: int = Field(
        3, ge=0, description="restarts of failed processes carried out before a failure reconfigures"
    )
    isolate_after: int = Field(2, ge=1, description="SEV1/SEV2 errors on one node before isolating it")
    isolation_s: float = Field(300.0, ge=0, description="how long an isolated node stays out")
    max_isolated_fraction: float = Field(
        0.25,
        ge=0,
        le=1,
        description="at most this fraction of the registered nodes (at least one) is isolated at once:"
        " past it, errors on node after node say more of the program or the network than of the"
        " machines, and isolating more would idle the cluster",
    )
    forget_lost_node_s: float = Field(
        3600.0,
        gt=0,
        description="a node lost this long, holding no workers, is forgotten (its agent, if it comes"
        " back, registers as a new node)",
    )
    # placement
    hot_spares: int = Field(1, ge=0, description="hot spares per task, on slots the plan leaves idle")
    rebalance_min_gain: float = Field(
        0.1, ge=0, description="a plan that only reshuffles running tasks must raise WAF by this fraction"
    )
    measure_window_s: float = Field(15.0, gt=0, description="throughput is measured over this much time")
    measure_change: float = Field(
        0.2, ge=0, description="a measurement replaces the one in use past this change"
    )
    task_failure_limit: int = Field(10, ge=1, description="failures within the window that fail a task")
    same_fault_limit: int = Field(
        3, ge=1, description="a task or storage fault repeated this often within the window fails the task"
    )
    storage_wait_s: float = Field(
        300.0,
        ge=0,
        description="at the last step, how long the final state waits for failing checkpoint storage to "
        "take it before the task fails (earlier checkpoints that fail are retried at the next one)",
    )
    task_fault_window_s: float = Field(
        2.0, gt=0, description="the same fault on two nodes of a task at once (within this) is the task's own"
    )

    @model_validator(mode="after")
    def _durations(self) -> Settings:
        # Each is sent to agents in orders and replies, whose durations are bounded (a stop's
        # grace of 1e9 s would be refused there, every time the coordinator gave it).
        for name in type(self).model_fields:
            value = getattr(self, name)
            if name.endswith("_s") and not 0 <= value <= MAX_SECONDS:
                raise ValueError(f"{name} is {value:g} s{FIX_MARK}use a duration from 0 to {MAX_SECONDS:g} s")
        return self

    @model_validator(mode="after")
    def _ordering(self) -> Settings:
        for low, high, equal_ok, why in ORDERING:
            a, b = getattr(self, low), getattr(self, high)
            if a > b or (a == b and not equal_ok):
                sign = "<=" if equal_ok else "<"
                raise ValueError(
                    f"{low} ({a:g}) must be {sign} {high} ({b:g}): {why}{FIX_MARK}"
                    f"lower {low} or raise {high} (docs/detection.md lists the ordering)"
                )
        return self

    def hang_deadline(self, mean_iteration_s: float) -> float:
        return min(self.hang_cap_s, max(self.hang_floor_s, self.hang_multiple * mean_iteration_s))

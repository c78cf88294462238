"""Messages between workers, agents and the coordinator. JSON on the wire, pydantic in code.

- A worker sends :data:`WorkerReport` datagrams to its agent over a local Unix socket.
- An agent registers, heartbeats (carrying its workers' states) and forwards reports to the
  coordinator over HTTP; orders (:data:`Order`) come back in the heartbeat's answer.

Every message carries the task and the generation it belongs to: a generation is one membership
of a task's workers, and anything from an older generation is stale.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, GetJsonSchemaHandler, TypeAdapter, model_validator
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from unicron.core.limits import (
    MAX_FIELDS,
    MAX_JSON_INT,
    MAX_LABEL_CHARS,
    MAX_LISTED_WORKERS,
    MAX_NOTE_CHARS,
    MAX_PEERS,
    MAX_REPORTS_PER_BEAT,
    MAX_SKIPPED,
    MAX_SLOTS,
    MAX_STACK_CHARS,
    Bound,
    EntryBounds,
    Int,
    Seconds,
    UnixTime,
    refuse_bool_numbers,
)
from unicron.core.names import NAME_PATTERN

INT_KEY = "^-?[0-9]{1,18}$"  # a JSON object's keys that are integers (pids, ranks)
IntKey = Annotated[int, Field(ge=-(10**18 - 1), le=10**18 - 1)]  # the same, as a number
LOG_TAIL_LINES, LOG_TAIL_CHARS = 20, 2000  # of a worker's output, in an exit before its first step
# The texts of agents' messages, bounded (``core/limits.py``).
Label = Annotated[str, Field(max_length=MAX_LABEL_CHARS)]  # a name, an id, a kind
Note = Annotated[str, Field(max_length=MAX_NOTE_CHARS)]  # a path, a message, a traceback's end
Stack = Annotated[str, Field(max_length=MAX_STACK_CHARS)]  # one worker's stack dump


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _no_bool_numbers(cls, data: Any) -> Any:
        return refuse_bool_numbers(cls, data)

    @classmethod
    def __get_pydantic_json_schema__(
        cls, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        """A message's ``type`` tag has a default (senders need not write it) but the unions
        that carry messages need it: the published schema says it is required."""
        result = handler.resolve_ref_schema(handler(schema))
        if "type" in result.get("properties", {}) and "type" not in result.get("required", []):
            result["required"] = [*result.get("required", []), "type"]
        return result


# ------------------------------------------------------------------ worker -> agent -> coordinator


class IterationReport(_Message):
    type: Literal["iteration"] = "iteration"
    task: Label
    generation: Int
    rank: Int
    step: Int  # the step just completed (1-based: after it, `step` optimizer steps are done)
    duration_s: Seconds
    samples: Int  # samples this rank processed in the step
    time: UnixTime = 0.0  # wall-clock time (Unix) the step ended, on the worker
    compute_s: Seconds = 0.0  # time spent in the rank's own forward/backward, before waiting for peers
    # Micro-batches this rank computed in the step for ranks that left it mid-step (the samples
    # nobody held after the group re-formed): work the failure cost.
    recomputed: Int = 0
    # When this rank's computing last (re)started in the step (Unix time): the step's start, or
    # when its group was re-formed mid-step. The end of a recovery's transition.
    resumed_at: UnixTime = 0.0


class FaultReport(_Message):
    """Sent by the fault-injection library just before it injects a fault (for measurements)."""

    type: Literal["fault"] = "fault"
    task: Label
    generation: Int
    rank: Int
    step: Int
    action: Label
    time: UnixTime
    # Its place in the task's list of faults: a generation-0 fault is claimed once by this
    # index, and the coordinator claims it again in a store it re-creates after a restart.
    index: Int | None = None


class ExceptionReport(_Message):
    type: Literal["exception"] = "exception"
    task: Label
    generation: Int
    rank: Int
    step: Int
    error_type: Label
    message: Note
    kind: Label = "other"  # an ErrorKind value, classified inside the worker
    traceback: Note = ""
    time: UnixTime = 0.0  # when it was raised (Unix time)


class CheckpointReport(_Message):
    type: Literal["checkpoint"] = "checkpoint"
    task: Label
    generation: Int
    rank: Int
    step: Int
    path: Note


class RestoredReport(_Message):
    """A worker resumed from a checkpoint: which tier and step, and the newer copies it passed
    over because they were unreadable or did not match their digest."""

    type: Literal["restored"] = "restored"
    task: Label
    generation: Int
    rank: Int
    step: Int
    source: Label  # "host_memory" | "persistent"
    path: Note
    skipped: list[tuple[Note, Note]] = Field(  # (file, why)
        default_factory=list, max_length=MAX_SKIPPED, fail_fast=True
    )


StorageTier = Literal["persistent", "host_memory"]  # where checkpoints are kept


class StorageReport(_Message):
    """A checkpoint tier stopped taking checkpoints (full, read-only, gone: ``ok`` False) and
    training goes on from the state in memory, or it takes them again (``ok`` True). Sent by the
    writing rank when the tier's state changes, not at every failed save."""

    type: Literal["storage"] = "storage"
    task: Label
    generation: Int
    rank: Int
    step: Int
    tier: StorageTier
    ok: bool
    error: Note = ""  # (the worker sends at most 2,000 characters)
    time: UnixTime = 0.0  # when the tier failed or came back (Unix time)


class DoneReport(_Message):
    type: Literal["done"] = "done"
    task: Label
    generation: Int
    rank: Int
    step: Int
    digest: Label  # parameter checksum at the end, for checking replicas agree


class ExitReport(_Message):
    """Written by the agent when a worker process ends."""

    type: Literal["exit"] = "exit"
    task: Label
    generation: Int
    rank: Int
    node: Label
    code: Int | None  # exit status, or None when killed by a signal
    signal: Int | None
    time: UnixTime = 0.0  # when the agent saw the exit (Unix time): the detection time starts here
    stop_ordered: bool = False  # it exited after a stop order: a consequence, not a fault
    reached: Int = 0  # the newest generation it had joined (it adopts later ones in place); 0: unknown
    # A worker that ended on its own before completing a step (a bad path, an import, an argument:
    # the script's own error, which the library never saw): its output file on the node, and the
    # file's last lines (at most LOG_TAIL_LINES lines and LOG_TAIL_CHARS characters).
    log: str | None = Field(default=None, max_length=4096)
    log_tail: str | None = Field(default=None, max_length=LOG_TAIL_CHARS)


class StacksReport(_Message):
    """Written by the agent after a ``DumpStacks`` order: each worker's Python stack (all threads,
    from faulthandler), keyed by rank; a stopped process cannot dump and has none."""

    type: Literal["stacks"] = "stacks"
    task: Label
    generation: Int  # the generation the dump was ordered for
    node: Label
    # rank -> stack (the agent shares MAX_STACKS_CHARS among them: ``control/agent/stackdump.py``)
    stacks: dict[IntKey, Stack] = Field(
        max_length=MAX_LISTED_WORKERS, json_schema_extra={"propertyNames": {"pattern": INT_KEY}}
    )
    time: UnixTime = 0.0
    # with ``peers`` ordered: the peers this node cannot connect to
    unreachable: Annotated[list[Label], Field(max_length=MAX_PEERS, fail_fast=True)] | None = None
    # with ``peers`` ordered: how many of the task's worker connections here wait on a TCP
    # retransmission (``control/tcpretrans``): a stall on a lossy link, not a hang
    retransmitting: Int | None = None


class NumericalReport(_Message):
    """A rank whose own gradients were wrong (not finite, or a spike) in a step whose sum was
    then computed again and came out right (``train/numerics.py``: a passing fault; the step went
    on, nothing of the bad sum applied), or whose state differed from its replicas' and was
    mended in place (``train/replicacheck.py``). Sent by the first rank named; a fault that
    persists ends the rank or the task with an exception instead (``ExceptionReport``)."""

    type: Literal["numerical"] = "numerical"
    task: Label
    generation: Int
    rank: Int
    step: Int  # the step whose sum was wrong (or, a replica mended, the first computed from its state)
    # train/numerics.py's Verdict: "transient", or "data" or "unresolved"; "odd_replica" for a
    # replica mended (train/replicacheck.py)
    verdict: Label
    # What was done (train/numerics.py's Outcome): "recomputed" (transient), "skipped" (the
    # step's update, run.on_bad_data: skip), "applied" (a spike the data gives) or "repaired" (a
    # replica whose state differed took its peers': train/replicacheck.py)
    outcome: Literal["recomputed", "skipped", "applied", "repaired"] = "recomputed"
    # every rank named with it (the report is this rank's own)
    ranks: Annotated[list[Int], Field(max_length=MAX_PEERS, fail_fast=True)]
    why: Note
    time: UnixTime = 0.0  # when the sum was found wrong (Unix time)
    spent_s: Seconds = 0.0  # from then until the step went on: its extra time


class LaunchFailedReport(_Message):
    """Written by the agent when a worker could not be started (no such program, not
    executable, no memory for a process)."""

    type: Literal["launch_failed"] = "launch_failed"
    task: Label
    generation: Int
    rank: Int
    node: Label
    error: Note
    time: UnixTime = 0.0


WorkerReport = Annotated[
    IterationReport
    | ExceptionReport
    | CheckpointReport
    | RestoredReport
    | StorageReport
    | DoneReport
    | ExitReport
    | FaultReport
    | LaunchFailedReport
    | NumericalReport
    | StacksReport,
    Field(discriminator="type"),
]
WORKER_REPORT = TypeAdapter(WorkerReport)


class Phase(StrEnum):
    """Where a worker is in its step, for telling a hung rank from the peers waiting for it."""

    SETUP = "setup"  # joining a group, loading state
    COMPUTE = "compute"  # its own forward/backward: nobody waits for it to enter this
    COLLECTIVE = "collective"  # inside a collective, waiting for its peers
    CHECKPOINT = "checkpoint"
    REJOIN = "rejoin"  # waiting for the coordinator's next membership


WAITING_PHASES = frozenset({Phase.COLLECTIVE, Phase.REJOIN})


class Progress(_Message):
    """A worker's position, written on its board each time it moves (per micro-batch, on
    entering a collective; ``core.position``). The agent reads the latest and reports it in the
    worker's state, so the coordinator sees which rank has not reached the collective the others
    wait in."""

    type: Literal["progress"] = "progress"
    pid: Int  # the worker, whatever generation and rank it has now
    generation: Int = 0  # the generation the worker is in (it moves on when it adopts the next)
    step: Int  # the step being trained
    phase: Phase
    what: Label = ""  # e.g. the collective's name
    micro_batch: Int = 0  # micro-batches of the step done so far
    time: UnixTime = 0.0


AgentDatagram = Annotated[
    IterationReport
    | ExceptionReport
    | CheckpointReport
    | RestoredReport
    | StorageReport
    | DoneReport
    | FaultReport
    | NumericalReport,
    Field(discriminator="type"),
]
# An agent that cannot reach a coordinator retries at most this far apart (its backoff's cap),
# so a coordinator that starts, takes over or resumes hears every live node within it.
AGENT_RETRY_CAP_S = 4.0
# How long an agent waits for the coordinator's answer. A coordinator that resumes from a stall
# reads the requests its agents gave up on meanwhile (they wait in its listen backlog): one read
# within this of its resume may be such a request, whose agent is still in its retry pause.
AGENT_REQUEST_TIMEOUT_S = 2.0
# How long an agent's probe of its peers may take (``control/agent/peerprobe.py``), which the
# coordinator allows for before it judges the check: a connect within a cluster takes
# milliseconds; a lost SYN is retried at 1 s.
PROBE_TIMEOUT_S = 3.0

AGENT_DATAGRAM = TypeAdapter(AgentDatagram)  # what a worker may send its agent


# ------------------------------------------------------------------ coordinator -> agent


class LaunchWorker(_Message):
    type: Literal["launch"] = "launch"
    task: str
    generation: Int
    rank: Int
    world_size: Int
    local_rank: Int
    argv: list[str]  # the program and its arguments
    env: dict[str, str] = Field(default_factory=dict)


class StopWorkers(_Message):
    """Stop a task's workers on this node: of generations up to ``generation`` (or all), or, with
    ``rank``, exactly that worker of ``generation``. SIGTERM first, SIGKILL after ``grace_s`` (at
    once when it is 0)."""

    type: Literal["stop"] = "stop"
    task: str
    generation: Int | None = None
    rank: Int | None = None
    grace_s: Seconds = 5.0


class RenameWorkers(_Message):
    """Surviving workers of one task on one node now belong to a new generation, each under a new
    rank (they rebuilt their process group in place; nothing restarts). One order per node, not
    per worker: a generation's switch of a large task renames hundreds."""

    type: Literal["rename"] = "rename"
    task: str
    generation: Int
    new_generation: Int
    # rank in ``generation`` -> rank in ``new_generation``
    ranks: dict[IntKey, Int] = Field(
        max_length=MAX_LISTED_WORKERS, json_schema_extra={"propertyNames": {"pattern": INT_KEY}}
    )


class DumpStacks(_Message):
    """Dump the Python stack of every worker of ``task`` on this node (a hang was detected) and
    answer with a StacksReport; a stop order that follows waits for the dump."""

    type: Literal["stacks"] = "stacks"
    task: str
    generation: Int
    wait_s: Seconds = 0.5  # how long to give the workers to write their stacks
    # The generation's other nodes (name -> host:port of their probe listener): connect to each
    # and report those that cannot be reached (a hang no rank can be blamed for: the network?).
    peers: dict[str, str] = Field(default_factory=dict)


class ForgetTask(_Message):
    """The task has ended: free what the node keeps for it (its in-memory checkpoints)."""

    type: Literal["forget"] = "forget"
    task: str
    checkpoint_dir: str
    host_checkpoint_root: str | None = None


STORE_ADDRESS_PATTERN = r"^[^\s,]{1,253}:[0-9]{1,5}$"  # host:port, no list


class StoreMoved(_Message):
    """The task's rendezvous store is served at ``address`` now, not on port ``moved_from``
    where the task's workers on this node were told: a coordinator that started over found that
    port taken. The agent adds both, after the store's earlier moves, where those workers look
    when their store stops answering (``WorkerEnv.store_file``); a worker follows the moves in
    order from the port it was launched with."""

    type: Literal["store_moved"] = "store_moved"
    task: str = Field(pattern=NAME_PATTERN)
    moved_from: int = Field(ge=1, le=65535)
    address: str = Field(pattern=STORE_ADDRESS_PATTERN)


# At most this much of a worker's log is read per request (``control/agent/logfiles.py``): the
# agent's answer carries it base64-encoded (4/3 of it) within a request body's limit.
LOG_CHUNK_BYTES = 512 * 1024
LOG_REQUEST_PATTERN = "^[0-9a-f]{32}$"
Count = Annotated[int, Field(ge=0, le=MAX_JSON_INT)]


class ReadLog(_Message):
    """Read part of a worker's log and answer with a ``LogChunk`` (``POST /v1/agents/{node}/logs``):
    from byte ``offset`` on (a follow), else its last ``tail`` lines, else its end; at most
    ``LOG_CHUNK_BYTES`` (``control/agent/logfiles.py``)."""

    type: Literal["read_log"] = "read_log"
    request: str = Field(pattern=LOG_REQUEST_PATTERN)
    task: str = Field(pattern=NAME_PATTERN)
    generation: Count
    rank: Count
    offset: Count | None = None
    tail: Count | None = None


class LogChunk(_Message):
    """An agent's answer to a ``ReadLog``: the bytes of the worker's log from ``offset`` (base64),
    the file's size when read, whether its worker still writes to it, and whether the byte cap
    (not the request) decided where the bytes start; ``error`` when there is no such file."""

    request: str = Field(pattern=LOG_REQUEST_PATTERN)
    path: str = Field(default="", max_length=4096)
    error: str = Field(default="", max_length=1000)
    offset: Count = 0
    size: Count = 0
    running: bool = False
    capped: bool = False
    data: str = Field(default="", max_length=4 * (LOG_CHUNK_BYTES // 3 + 1))


Order = Annotated[
    LaunchWorker | StopWorkers | RenameWorkers | ForgetTask | DumpStacks | ReadLog | StoreMoved,
    Field(discriminator="type"),
]


# ------------------------------------------------------------------ agent <-> coordinator


class WorkerState(_Message):
    task: Label
    generation: Int
    rank: Int
    pid: Int
    running: bool
    stopped: bool = False  # the process is stopped (SIGSTOP, state T): it cannot be progressing
    returncode: Int | None = None  # once it exited: its code, or minus the signal that ended it
    progress: Progress | None = None  # the latest the worker sent (None: it sends none)
    # Its exit report still waits in the agent's backlog, behind the reports it sent before it
    # (a coordinator restarted, a partition): the exit is heard there, in order, not from the list
    exit_unsent: bool = False


# What an agent lists of its workers: the running ones and those that exited lately.
Listed = Annotated[list[WorkerState], Field(max_length=MAX_LISTED_WORKERS, fail_fast=True)]


class Registration(_Message):
    node: str = Field(pattern=NAME_PATTERN)
    slots: int = Field(gt=0, le=MAX_SLOTS)  # (Int's own bound would win over this one)
    gpus: list[Label] = Field(default_factory=list, max_length=MAX_SLOTS)  # device ids, none without GPUs
    host: Label = "127.0.0.1"
    probe_port: Int = 0  # the agent's peer-probe listener on ``host`` (0: none)
    workers: Listed = Field(default_factory=list)
    # The failure domain the node shares with others (a rack, a leaf switch, a power feed: the
    # agent's ``--domain``): their silence is judged together (``control/detect/silence.py``).
    domain: str | None = Field(None, pattern=NAME_PATTERN)
    # When the agent read its workers' states (Unix time, the node's clock, as a heartbeat's):
    # how long each had been where it was (``control/detect/hangs.py``).
    sent: UnixTime | None = None


class RegistrationReply(_Message):
    node: str
    heartbeat_interval_s: Seconds
    heartbeat_deadline_s: Seconds


class Heartbeat(_Message):
    node: str = Field(pattern=NAME_PATTERN)
    workers: Listed = Field(default_factory=list)
    # The agent sends more in the heartbeats that follow at once (``control/agent/backlog.py``).
    reports: list[WorkerReport] = Field(default_factory=list, max_length=MAX_REPORTS_PER_BEAT, fail_fast=True)
    acked: Int = 0  # the last order number carried out
    # When the agent sent it (Unix time, each attempt anew): how long heartbeats wait before the
    # coordinator reads them tells it how far behind it is (``control/detect/silence.py``).
    sent: UnixTime | None = None
    # Seconds since the agent's last answered heartbeat: a node whose requests the coordinator
    # left unanswered (timed out in its backlog) was alive all along, and says so when one is read.
    waited_s: Seconds | None = None


# What a registration or a heartbeat may hold, checked on its parsed body before either model is
# built (``control/service/agentchannel.py``), so that the worst body under MAX_BODY_BYTES is
# refused without validating thousands of entries; the models' fields say the same bounds.
FIELDS = Bound(MAX_FIELDS, "fields", "send only the message's fields (the OpenAPI schema at /openapi.json)")
AGENT_BOUNDS = EntryBounds(
    {
        (): FIELDS,
        ("gpus",): Bound(MAX_SLOTS, "GPUs", f"offer at most {MAX_SLOTS} GPUs (and slots) on one node"),
        ("workers",): Bound(
            MAX_LISTED_WORKERS,
            "workers",
            f"list at most {MAX_LISTED_WORKERS} workers: the running ones and those that exited lately",
        ),
        ("workers", "[]"): FIELDS,
        ("workers", "[]", "progress"): FIELDS,
        ("reports",): Bound(
            MAX_REPORTS_PER_BEAT,
            "reports",
            f"send at most {MAX_REPORTS_PER_BEAT} reports in one heartbeat, the rest in the next ones",
        ),
        ("reports", "[]"): FIELDS,
        ("reports", "[]", "stacks"): Bound(
            MAX_LISTED_WORKERS, "stacks", f"report at most {MAX_LISTED_WORKERS} workers' stacks at once"
        ),
        ("reports", "[]", "skipped"): Bound(
            MAX_SKIPPED, "copies passed over", f"name at most {MAX_SKIPPED} checkpoint copies passed over"
        ),
        ("reports", "[]", "skipped", "[]"): Bound(2, "entries", "give each copy passed over as [file, why]"),
        ("reports", "[]", "unreachable"): Bound(
            MAX_PEERS, "peers", f"name at most {MAX_PEERS} peers this node cannot reach"
        ),
        ("reports", "[]", "ranks"): Bound(
            MAX_PEERS, "ranks", f"name at most {MAX_PEERS} ranks with a numerical fault"
        ),
    }
)


class OrderBatch(_Message):
    """Orders for a node, each with its number: the agent acknowledges the last it carried out."""

    orders: list[Order] = Field(default_factory=list)
    numbers: list[Int] = Field(default_factory=list)  # each order's number, increasing


class HeartbeatReply(_Message):
    orders: list[Order] = Field(default_factory=list)
    numbers: list[Int] = Field(default_factory=list)  # acknowledge the last once carried out
    registered: bool = True  # False: the coordinator does not know this node; register again
    # How often to beat from now on (it grows and shrinks with the cluster: ``core/cadence.py``);
    # None: as before.
    heartbeat_interval_s: Seconds | None = None


# ------------------------------------------------------------------ in-process membership changes


class Membership(_Message):
    """The workers of a task's next generation, written by the coordinator into the task's
    rendezvous store; survivors keep their processes and take new ranks."""

    generation: Int
    world_size: Int
    ranks: dict[int, int] = Field(
        json_schema_extra={"propertyNames": {"pattern": INT_KEY}}
    )  # rank in the old generation -> rank in the new one (absent: leave)
    # Ranks declared failed: a collective waiting for them will never finish.
    failed: list[Int] = []
    # A recovery (ranks failed, or a reattempt of a collective stuck with every rank alive):
    # members abandon the step in progress and retry it in the new group. Otherwise (a planned
    # grow or shrink) members finish the step first.
    abandon: bool = False


def fault_claim_key(task: str, index: int) -> str:
    """The counter whose first increment claims the task's generation-0 fault ``index``."""
    return f"{task}/fault/{index}"


def membership_key(task: str, generation: int) -> str:
    """Where the coordinator writes the membership that follows ``generation``."""
    return f"{task}/membership/{generation}"


def current_key(task: str) -> str:
    """Where the coordinator writes the task's ``Current`` generation, at every launch and every
    change of membership: a checkpoint is committed only by a member of it
    (``train/fencing.py``)."""
    return f"{task}/current"


class Current(_Message):
    """The task's current generation, and the one last launched from a checkpoint. The second
    is what lets a worker tell "relaunched without me" (its generation is older than the launch)
    from "a membership I should follow is missing" (deleted from the store: ask again), and it
    never makes a member of the current lineage superseded, whatever old value is replayed."""

    generation: Int
    launched: Int


SPARE_GENERATION = 0  # hot spares run as generation 0 of their task until they are used


def spare_key(task: str, rank: int) -> str:
    """Where the coordinator writes the identity a hot spare takes on (JSON: generation, rank,
    world_size) when it is used."""
    return f"{task}/spare/{rank}"


def ready_key(task: str, generation: int, rank: int) -> str:
    """Set by a newcomer of ``generation`` just before it joins its live peers."""
    return f"{task}/ready/{generation}/{rank}"

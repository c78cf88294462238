"""The one contract between the coordinator, the agent and a worker: the worker's environment.

The coordinator fills in the task's part (task, generation, store, checkpoints, timeouts), the
agent adds the node's part (node, local rank, its report socket) when it launches the process,
and the training library reads it back. All three use :class:`WorkerEnv`, so a key is named in
exactly one place (:data:`KEYS`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from unicron.core.specs import FIX_MARK

# field -> environment variable
KEYS: dict[str, str] = {
    "task": "UNICRON_TASK",
    "generation": "UNICRON_GENERATION",
    "rank": "UNICRON_RANK",
    "world_size": "UNICRON_WORLD_SIZE",
    "replica_size": "UNICRON_REPLICA_SIZE",
    "store": "UNICRON_STORE",
    "store_key": "UNICRON_STORE_KEY",
    "store_hosts": "UNICRON_STORE_HOSTS",
    "store_file": "UNICRON_STORE_FILE",
    "checkpoint_dir": "UNICRON_CHECKPOINT_DIR",
    "iterations": "UNICRON_ITERATIONS",
    "checkpoint_every": "UNICRON_CHECKPOINT_EVERY",
    "checkpoint_async": "UNICRON_CHECKPOINT_ASYNC",
    "pg_timeout_s": "UNICRON_PG_TIMEOUT",
    "membership_timeout_s": "UNICRON_MEMBERSHIP_TIMEOUT",
    "storage_wait_s": "UNICRON_STORAGE_WAIT",
    "recovery": "UNICRON_RECOVERY",
    "check_finite": "UNICRON_CHECK_FINITE",
    "spike_factor": "UNICRON_SPIKE_FACTOR",
    "spike_window": "UNICRON_SPIKE_WINDOW",
    "on_bad_data": "UNICRON_ON_BAD_DATA",
    "digest_every": "UNICRON_DIGEST_EVERY",
    "faults": "UNICRON_FAULTS",
    "joining": "UNICRON_JOINING",
    "spare": "UNICRON_SPARE",
    "node": "UNICRON_NODE",
    "local_rank": "UNICRON_LOCAL_RANK",
    "agent_socket": "UNICRON_AGENT_SOCKET",
    "agent_pid": "UNICRON_AGENT_PID",
    "trace_file": "UNICRON_TRACE_FILE",
    "stack_file": "UNICRON_STACK_FILE",
    "position_file": "UNICRON_POSITION_FILE",
    "host_checkpoints": "UNICRON_HOST_CHECKPOINTS",
    "host_checkpoint_root": "UNICRON_HOST_CHECKPOINT_ROOT",
    "preload": "UNICRON_PRELOAD",
}
_FLAGS = ("joining", "spare", "host_checkpoints", "check_finite")

# A gradient sum whose norm is over SPIKE_FACTOR times the median of the last SPIKE_WINDOW norms
# is a spike (``train/spikes.py`` says why these); 0 turns the spike's test off.
SPIKE_FACTOR = 10.0
SPIKE_WINDOW = 100
SPIKE_WINDOWS = (10, 100_000)  # the window's bounds: at least the norms a spike is judged by
SPIKE_FACTOR_MAX = 1e6
# The replicas compare their state's digest every DIGEST_EVERY steps (``train/replicacheck.py``
# says why every step).
DIGEST_EVERY = 1


def _above_noise(factor: float) -> float:
    """A spike's factor under 2 would take a healthy step's variation for a spike (0: no test)."""
    if 0 < factor < 2:
        raise ValueError(
            f"{factor:g} is within a healthy step's variation{FIX_MARK}use 2 or more (the default "
            f"is {SPIKE_FACTOR:g}), or 0 for no spike test"
        )
    return factor


# run.spike_factor, in the task file and in the worker contract alike.
SpikeFactor = Annotated[
    float, Field(ge=0, le=SPIKE_FACTOR_MAX, allow_inf_nan=False), AfterValidator(_above_noise)
]


STORE_MOVES_KEPT = 64  # the moves of a task's store its agents keep (one per coordinator restart at most)


class WorkerEnv(BaseModel):
    """What a worker is told about itself. Defaults are those of a world of one."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task: str
    generation: int = 0
    rank: int = 0
    world_size: int = 1
    replica_size: int = 1  # ranks per data-parallel replica (run.replica_size): ranks r*K..r*K+K-1
    store: str | None = None  # host:port of the task's rendezvous store
    store_key: str | None = None  # hex key signing the store's values (core.signing)
    # Every coordinator's host, comma-separated (the agent's --coordinator list): one that takes
    # over serves the task's store on the same port on its own host.
    store_hosts: str | None = None
    # Where the worker's agent writes the store's moves (``<old port> <host:port>`` a line, the
    # last STORE_MOVES_KEPT) when the coordinator serves it where the worker was not told (one
    # that started over found its port taken): read first whenever the store stops answering
    # (``train/storeaddress.py``).
    store_file: str | None = None
    checkpoint_dir: str | None = None
    iterations: int = 0
    checkpoint_every: int = 0
    # A sharded replica's periodic checkpoints in the background (None: where it trains on a GPU).
    checkpoint_async: bool | None = None
    pg_timeout_s: float | None = None  # None: the library's default (Settings)
    membership_timeout_s: float | None = None
    storage_wait_s: float | None = None  # the final state's wait for failing storage (Settings)
    recovery: Literal["in_process", "restart"] = "in_process"
    check_finite: bool = True  # each step's gradient sum tested before it is applied (run.check_finite)
    spike_factor: SpikeFactor = SPIKE_FACTOR
    spike_window: int = Field(SPIKE_WINDOW, ge=SPIKE_WINDOWS[0], le=SPIKE_WINDOWS[1])
    on_bad_data: Literal["fail", "skip"] = "fail"  # run.on_bad_data
    digest_every: int = Field(DIGEST_EVERY, ge=0)  # run.digest_every: the replicas' check (0: never)
    faults: list[dict[str, Any]] | None = None
    joining: bool = False  # a newcomer to live replicas
    spare: bool = False  # a hot spare: wait to be used
    node: str | None = None
    local_rank: int = 0
    agent_socket: str | None = None
    # The agent's process (its workers' parent is its fork server: ``control/agent/warmstart.py``).
    agent_pid: int | None = None
    trace_file: str | None = None
    stack_file: str | None = None  # where the worker's stack goes when its agent asks (SIGUSR1)
    position_file: str | None = None  # the board its agent reads its position from (core.position)
    host_checkpoints: bool = True  # keep an in-memory (tmpfs) checkpoint copy per node
    host_checkpoint_root: str | None = None
    # run.preload, comma-separated: what the node's fork server imports beyond torch before it
    # forks this task's workers (``control/agent/warmstart.py``).
    preload: str | None = None

    def store_addresses(self) -> str:
        """Where the task's store may be, comma-separated: the address it was launched with
        first, then the same port on each other coordinator's host (``addresses``)."""
        if not self.store:
            return ""
        host, port = self.store.rsplit(":", 1)
        others = [h for h in (self.store_hosts or "").split(",") if h and h != host]
        return ",".join([self.store, *(f"{h}:{port}" for h in dict.fromkeys(others))])

    def to_env(self) -> dict[str, str]:
        """The environment variables, without those left at None."""
        out: dict[str, str] = {}
        for name, key in KEYS.items():
            value = getattr(self, name)
            if value is None:
                continue
            if name in _FLAGS:
                out[key] = "1" if value else "0"
            elif name == "faults":
                out[key] = json.dumps(value)
            else:
                out[key] = str(value)
        return out

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> WorkerEnv | None:
        """The contract read back; None when the process was not started by a Unicron agent."""
        if KEYS["task"] not in env:
            return None
        values: dict[str, Any] = {}
        for name, key in KEYS.items():
            raw = env.get(key)
            if raw is None or raw == "":
                continue
            if name in _FLAGS:
                values[name] = raw.lower() in ("1", "true", "yes")
            elif name == "faults":
                values[name] = json.loads(raw)
            else:
                values[name] = raw
        return cls.model_validate(values)


def host_checkpoint_dir(persistent: str | Path, node: str, root: str | None = None) -> Path:
    """Where a node keeps its in-memory copy of a task's checkpoints: a RAM-backed folder
    (/dev/shm by default), one per persistent checkpoint folder (so per task and cluster) and
    per node. The library writes there; the agent removes it when the task has ended."""
    key = hashlib.sha256(str(Path(persistent).resolve()).encode()).hexdigest()[:16]
    return Path(root or "/dev/shm") / "unicron" / key / node


def unmanaged_identity(env: Mapping[str, str]) -> dict[str, str]:
    """The contract's identity keys for a worker not started by a Unicron agent: under torchrun
    from its variables (each restart is a generation), else a world of one."""
    torchrun = "TORCHELASTIC_RUN_ID" in env
    restarts = int(env.get("TORCHELASTIC_RESTART_COUNT", "0"))
    return {
        KEYS["task"]: "torchrun" if torchrun else "standalone",
        KEYS["generation"]: str(restarts + 1 if torchrun else 0),
        KEYS["rank"]: env.get("RANK", "0"),
        KEYS["world_size"]: env.get("WORLD_SIZE", "1"),
        KEYS["local_rank"]: env.get("LOCAL_RANK", "0"),
        # No agent frees a node's in-memory copies when such a run ends: none unless asked for.
        KEYS["host_checkpoints"]: env.get(KEYS["host_checkpoints"], "0"),
    }


def addresses(text: str) -> list[str]:
    """The ``host:port`` addresses in a comma-separated list (``WorkerEnv.store_addresses``)."""
    return [a.strip() for a in text.split(",") if a.strip()]

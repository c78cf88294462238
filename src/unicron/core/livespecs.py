"""Live task specs: what the coordinator runs (a planner task plus how to run its workers),
and the faults a task may have injected into its workers for tests and demos."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator

from unicron.core.limits import (
    MAX_ARGS,
    MAX_ENV_KEYS,
    MAX_FAULT_TIMES,
    MAX_FAULTS,
    MAX_FLOPS,
    MAX_JSON_INT,
    MAX_PRELOAD,
    MAX_TABLE_ROWS,
    MAX_TASKS_PER_SUBMIT,
    MAX_TEXT_CHARS,
    MAX_WORKERS,
    Bound,
    Bounds,
    Seconds,
    Steps,
)
from unicron.core.safeyaml import load_yaml_text
from unicron.core.specs import (
    FIX_MARK,
    NodeHardware,
    SpecBase,
    TaskSpec,
    unique_names,
    validate_spec,
)
from unicron.core.workerenv import (
    DIGEST_EVERY,
    KEYS,
    SPIKE_FACTOR,
    SPIKE_WINDOW,
    SPIKE_WINDOWS,
    SpikeFactor,
)

Text = Annotated[str, Field(max_length=MAX_TEXT_CHARS)]
MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def _module_name(name: str) -> str:
    if not MODULE_NAME.fullmatch(name):
        raise ValueError(
            f"{name!r} is not a module's dotted name{FIX_MARK}name an installed module as `import` "
            "takes it, e.g. transformers or torch.distributed.fsdp"
        )
    return name


# An importable module's dotted name, as ``import`` takes it (run.preload).
ModuleName = Annotated[str, Field(max_length=256), AfterValidator(_module_name)]

# The worker contract's keys that a field of ``run:`` gives (``run.env`` may not set them).
FIELD_KEYS = {
    KEYS[field]: field
    for field in (
        "iterations",
        "checkpoint_every",
        "checkpoint_async",
        "recovery",
        "replica_size",
        "faults",
        "check_finite",
        "spike_factor",
        "spike_window",
        "on_bad_data",
        "digest_every",
        "preload",
    )
}

# Faults that damage state without failing a process: their time is not a failure's start.
CORRUPTIONS = frozenset({"corrupt_transfer", "corrupt_checkpoint"})
# ... nor is the time of any of these, which fail nothing (a stop taken late is still a stop).
NOT_FAILURES = CORRUPTIONS | {"late_stop"}
# Faults in the gradient sum, found and handled in the step by the workers (``train/numerics.py``):
# a passing one never reaches the coordinator, so its time must not start a later failure's clock;
# a verdict that does is timed from its own report.
NUMERICAL = frozenset(
    {"nan_grad", "spike_grad", "flip_grad", "nan_sample", "flip_param", "nan_loss", "spike_loss"}
)


class FaultSpec(SpecBase):
    """A fault to inject into a live task's worker (unicron.train.faults)."""

    action: Literal[
        "kill",
        "kill_after_reduce",
        "kill_in_backward",
        "hang",
        "stall",
        "spin",
        "stall_before_reduce",
        "raise",
        "slow",
        "break",
        "lose_node",
        "corrupt_transfer",
        "corrupt_checkpoint",
        "slow_save",
        "stall_rejoin",
        "kill_in_agree",
        "kill_in_transfer",
        "late_stop",
        "hang_at_exit",
        "nan_grad",
        "spike_grad",
        "flip_grad",
        "nan_sample",
        "flip_param",
        "nan_loss",
        "spike_loss",
    ] = Field(description="what happens; unicron/train/faults.py describes each")
    rank: int = Field(ge=0, le=MAX_WORKERS, description="the rank it strikes (in the generation it strikes)")
    step: Steps = Field(description="injected when this step starts")
    generation: int = Field(
        default=1,
        ge=0,
        le=MAX_JSON_INT,
        description="only in this generation; 0: whichever worker first reaches the step",
    )
    message: str = Field(
        default="CUDA error: an illegal memory access was encountered",
        max_length=MAX_TEXT_CHARS,
        description="for raise: the exception's message",
    )
    error: str = Field(default="RuntimeError", max_length=200, description="for raise: the exception's type")
    seconds: Seconds = Field(
        default=5.0,
        description=(
            "for stall, spin, stall_before_reduce, stall_rejoin, slow_save, hang_at_exit: how long;"
            " for slow: extra per step; for late_stop: how late"
        ),
    )
    times: int = Field(
        default=1,
        ge=1,
        le=MAX_FAULT_TIMES,
        description="for nan_grad, spike_grad, flip_grad, nan_loss and spike_loss: how many computations "
        "of the step it strikes on the rank (1: a passing fault; 2 or more: a device that keeps "
        "computing wrong, whatever its samples)",
    )
    factor: float = Field(
        default=1e4,
        ge=2,
        le=1e30,
        allow_inf_nan=False,
        description="for spike_grad and spike_loss: what it multiplies the rank's gradient (its loss) "
        "by (a flipped exponent bit multiplies a value by a power of two)",
    )
    sample: int = Field(
        default=0,
        ge=0,
        le=MAX_JSON_INT,
        description="for nan_sample: the sample whose gradients are NaN in the step, on whichever rank "
        "computes it (the rank field is not used)",
    )
    bit: int = Field(
        default=0,
        ge=0,
        le=63,
        description="for flip_param: the bit of the first parameter's first value it flips; for "
        "flip_grad: of the first value of the rank's gradient sent first; counted from the lowest (0: a "
        "change no test of a norm sees; past the value's width: taken modulo it)",
    )


class RunSpec(SpecBase):
    """How to run a live task's workers."""

    program: list[Text] = Field(
        min_length=1,
        max_length=MAX_ARGS,
        description="argv; a leading 'python' is the agent's interpreter; relative paths are from "
        "the task file's folder (`unicron submit` sends them absolute)",
    )
    iterations: Steps = Field(
        description="optimizer steps to train: the task's one count. Each worker is given it "
        "(UNICRON_ITERATIONS) and `session.steps` ends there; a count the script passes itself "
        "(`Session(iterations=...)`) applies only when it runs without an agent",
    )
    checkpoint_every: Steps = Field(default=20, description="steps between checkpoints")
    checkpoint_async: bool | None = Field(
        default=None,
        description="with replica_size > 1: write periodic checkpoints to the checkpoint folder in "
        "the background (DCP async_save; the step waits only for a copy to host memory); unset: "
        "where the workers train on GPUs (on CPUs the writer takes the training's own cores: "
        "docs/checkpointing.md). The final one, and the node-memory copy, are written before going on",
    )
    flops_per_sample: float | None = Field(
        default=None,
        gt=0,
        le=MAX_FLOPS,
        allow_inf_nan=False,
        description="FLOPs of one sample, for measured FLOP/s and WAF; a task with `model:` takes it "
        "from the model. Without it a task's steps are measured in samples/s: its scaling is "
        "measured, its level assumed (docs/live-cluster.md)",
    )
    env: dict[Text, Text] = Field(
        default_factory=dict,
        max_length=MAX_ENV_KEYS,
        description="added to each worker's environment; may set the contract's task keys (e.g. "
        "UNICRON_TRACE_FILE); the agent's rank, world size and node keys always win",
    )
    preload: list[ModuleName] = Field(
        default_factory=list,
        max_length=MAX_PRELOAD,
        description="modules the node's fork server imports, beyond torch's, before it forks this "
        "task's workers: each worker started on a node (at launch, restarted, joining) then skips "
        "their import; installed modules, named as deep as the program imports them (a "
        "Transformers Llama: [transformers.models.llama.modeling_llama]; docs/warm-start.md)",
    )
    faults: list[FaultSpec] = Field(
        default_factory=list, max_length=MAX_FAULTS, description="faults to inject, for tests and demos"
    )
    check_finite: bool = Field(
        default=True,
        description="test each step's gradient sum for NaN and Inf, and its norm for a spike "
        "(spike_factor), and so the value of each metric the program declares checked (its loss: "
        "session.metric(name, checked=True)), before the optimizer applies it; a sum that is wrong is "
        "never applied: the step is computed again, the culprit rank and whose fault it is are found "
        "(docs/numerical-faults.md)",
    )
    spike_factor: SpikeFactor = Field(
        default=SPIKE_FACTOR,
        description="with check_finite: a gradient sum whose norm (or a checked metric, the loss, whose "
        "value) is over this many times the median of the last spike_window steps' is a spike, "
        "computed again and cross-checked as a sum that is not finite (docs/numerical-faults.md); 2 or "
        "more, or 0: no spike test",
    )
    spike_window: int = Field(
        default=SPIKE_WINDOW,
        ge=SPIKE_WINDOWS[0],
        le=SPIKE_WINDOWS[1],
        description="how many of the last steps' gradient norms (checked metrics' values) the spike's "
        "median is taken over",
    )
    on_bad_data: Literal["fail", "skip"] = Field(
        default="fail",
        description="with check_finite, a step whose samples give a wrong sum wherever they are "
        "computed: fail ends the task with the verdict where the sum is not finite (a spike, what "
        "the data gives, is applied); skip skips the step's update (no optimizer step, its samples "
        "recorded as skipped) and goes on, but not twice within 100 steps (docs/numerical-faults.md)",
    )
    digest_every: int = Field(
        default=DIGEST_EVERY,
        ge=0,
        le=MAX_JSON_INT,
        description="every this many steps the replicas compare their parameters, bit for bit, as "
        "they enter the step's gradient sum (and their whole state before each checkpoint); nothing "
        "of a sum they differ in is applied: a replica alone in its state takes the others' in place "
        "where they were alike the step before, else the task goes back to its checkpoint "
        "(docs/numerical-faults.md); 0: never. Not with replica_size over 1",
    )
    recovery: Literal["in_process", "restart"] = Field(
        default="in_process",
        description="in_process: survivors rebuild their group and go on; restart: every failure "
        "restarts the task from its checkpoint",
    )
    replica_size: int = Field(
        default=1,
        ge=1,
        le=4096,
        description="ranks per data-parallel replica (the model is sharded within one): the task "
        "is planned, placed and recovered in whole replicas; counts must be its multiples",
    )

    @field_validator("env", mode="after")
    @classmethod
    def _one_source(cls, env: dict[str, str]) -> dict[str, str]:
        # A key the task file gives a field for is that field's: two sources of one count (a
        # task's length in `run.iterations` and again in `run.env`) would disagree.
        for key in env:
            if key in FIELD_KEYS:
                raise ValueError(
                    f"run.env sets {key}, which run.{FIELD_KEYS[key]} gives{FIX_MARK}remove it from "
                    f"run.env and set run.{FIELD_KEYS[key]}"
                )
        return env

    @model_validator(mode="after")
    def _numerical_faults_are_tested(self) -> RunSpec:
        # The gradient sum's test and the replicas' check cover one rank per replica: a fault
        # injected elsewhere would train on untested (``train/numerics.py``, ``replicacheck.py``).
        found = sorted({f.action for f in self.faults if f.action in NUMERICAL})
        if found and self.replica_size > 1:
            raise ValueError(
                f"run.faults injects {', '.join(found)}, which the numerical checks do not cover "
                f"with run.replica_size {self.replica_size}{FIX_MARK}use them with run.replica_size 1"
            )
        return self

    @field_validator("program", mode="before")
    @classmethod
    def _argv_as_text(cls, value: Any) -> Any:
        # YAML reads `--steps, 10` as a number; an argv holds text.
        if isinstance(value, list):
            return [str(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v for v in value]
        return value


class LiveTaskSpec(TaskSpec):
    """A task submitted to the coordinator: what the planner needs, and how to run it. It may
    give neither ``model`` nor ``throughput``: it is then planned on an assumed curve until its
    first steps are measured."""

    MEASURED_LIVE: ClassVar[bool] = True

    run: RunSpec = Field(description="how its workers run")

    @model_validator(mode="after")
    def _flops_from_the_model(self) -> LiveTaskSpec:
        if self.model is not None and self.run.flops_per_sample is not None:
            raise ValueError(
                "run.flops_per_sample is derived from the model"
                f"{FIX_MARK}remove run.flops_per_sample, or use a throughput table instead of model"
            )
        return self

    @model_validator(mode="after")
    def _whole_replicas(self) -> LiveTaskSpec:
        size = self.run.replica_size
        counts = [("worker_step", self.worker_step), ("min_workers", self.min_workers)]
        counts += [("max_workers", self.max_workers), ("current_workers", self.current_workers or None)]
        counts += [("throughput", count) for count in self.throughput or {}]
        for field, count in counts:
            if count is not None and count % size:
                raise ValueError(
                    f"{field} {count} is not a whole number of replicas of run.replica_size {size}"
                    f"{FIX_MARK}use multiples of {size} (or change run.replica_size)"
                )
        return self

    @property
    def replica_size(self) -> int:
        return self.run.replica_size

    @property
    def step(self) -> int:
        """Usable counts are multiples of both ``worker_step`` and the replica size."""
        return math.lcm(self.worker_step or 1, self.run.replica_size)

    @property
    def step_named(self) -> str:
        if self.run.replica_size == 1:
            return super().step_named
        whole = f"run.replica_size {self.run.replica_size} (whole replicas)"
        return whole if self.worker_step is None else f"{self.step} (worker_step and {whole})"


def replica_misfit(spec: LiveTaskSpec, slots: int) -> str | None:
    """Why ``spec``'s replicas cannot be placed whole on nodes of ``slots``, or None: a replica
    must fill a node evenly (its size divides the node's) or span whole nodes (a multiple)."""
    size = spec.run.replica_size
    if slots % size == 0 or size % slots == 0:
        return None
    return (
        f"task {spec.name}: run.replica_size {size} neither divides nor spans whole nodes of {slots} slots"
        f"{FIX_MARK}use a divisor or a multiple of {slots}"
    )


class LiveClusterSpec(NodeHardware):
    """The live cluster's hardware, for the planner: nodes are not listed (they join as their
    agents register, each with its slots). ``unicron coordinator --cluster FILE``."""


# Without --cluster: one slot stands for a device of 1 TFLOP/s (an assumption: the local CPU
# cluster emulates devices, docs/live-cluster.md) and a node fails every 1,000 hours (an
# assumption, of the order of the 2,000 h examples/cluster-128.yaml derives from Llama 3's run).
DEFAULT_LIVE_CLUSTER = LiveClusterSpec(gpu=1e12, node_mtbf_hours=1000)


def parse_live_cluster(text: str, source: str = "<cluster>") -> LiveClusterSpec:
    return validate_spec(LiveClusterSpec, load_yaml_text(text, source), source)


class LiveTaskList(SpecBase):
    tasks: list[LiveTaskSpec] = Field(min_length=1, max_length=MAX_TASKS_PER_SUBMIT)

    @field_validator("tasks", mode="after")
    @classmethod
    def _unique_names(cls, tasks: list[LiveTaskSpec]) -> list[LiveTaskSpec]:
        # One submission is taken whole or not at all: two tasks of one name refuse both.
        return unique_names(tasks)


# What a submission may hold, checked as it is parsed (``core/safeyaml.py``), before any model.
TASK_BOUNDS: dict[tuple[str, ...], Bound] = {
    ("run", "env"): Bound(MAX_ENV_KEYS, "variables", f"set at most {MAX_ENV_KEYS} variables in run.env"),
    ("run", "program"): Bound(MAX_ARGS, "arguments", f"pass at most {MAX_ARGS} arguments in run.program"),
    ("run", "faults"): Bound(MAX_FAULTS, "faults", f"inject at most {MAX_FAULTS} faults into one task"),
    ("throughput",): Bound(MAX_TABLE_ROWS, "rows", f"give at most {MAX_TABLE_ROWS} rows in throughput"),
}
SUBMIT_BOUNDS: Bounds = {
    ("tasks",): Bound(
        MAX_TASKS_PER_SUBMIT,
        "tasks",
        f"submit at most {MAX_TASKS_PER_SUBMIT} tasks at a time (split the file)",
    ),
    **TASK_BOUNDS,
    **{("tasks", "[]", *path): bound for path, bound in TASK_BOUNDS.items()},
}


def parse_live_tasks(text: str, source: str = "<task>") -> list[LiveTaskSpec]:
    """One task (a mapping with ``name``) or several (under ``tasks:``)."""
    data = load_yaml_text(text, source, SUBMIT_BOUNDS)
    if isinstance(data, Mapping) and "tasks" in data:
        return list(validate_spec(LiveTaskList, data, source).tasks)
    return [validate_spec(LiveTaskSpec, data, source)]

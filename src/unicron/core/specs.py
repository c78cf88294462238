"""Cluster and task specs: the YAML users write, validated with pydantic.

Parsing turns every validation failure into a :class:`SpecError` that names the source, the field
path (``tasks[2].weight``) and the fix. Reading files is the caller's job: this module parses text.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from unicron.core.errors import SpecError, SpecProblem
from unicron.core.gpus import KNOWN_GPUS, GpuType, custom_gpu, lookup_gpu
from unicron.core.limits import (
    MAX_FLOPS,
    MAX_MODEL_SIZE,
    MAX_SECONDS,
    MAX_STATE_BYTES,
    MAX_TABLE_ROWS,
    MAX_WEIGHT,
    MAX_WORKERS,
    brief,
    refuse_bool_for_number,
)
from unicron.core.names import NAME_PATTERN
from unicron.core.safeyaml import load_yaml_text

FIX_MARK = "; fix: "
Workers = Annotated[int, Field(gt=0, le=MAX_WORKERS)]  # a count of workers (GPUs)
FlopRate = Annotated[float, Field(gt=0, le=MAX_FLOPS, allow_inf_nan=False)]  # FLOP/s
Size = Annotated[int, Field(gt=0, le=MAX_MODEL_SIZE)]  # one dimension of a model
_M = TypeVar("_M", bound=BaseModel)


class SpecBase(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        return refuse_bool_for_number(cls, value, info)


def _positive_number(value: Any, what: str) -> float:
    """Accept numbers and numeric strings such as ``312e12`` (YAML reads those as strings)."""
    if isinstance(value, bool):
        raise ValueError(f"{what} must be a number, got {value!r}{FIX_MARK}write a number")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(
            f"{what} must be a number, got {value!r}{FIX_MARK}write a number such as 150e12"
        ) from None
    if not math.isfinite(number) or number <= 0:
        raise ValueError(f"{what} must be positive, got {value!r}{FIX_MARK}use a value above 0")
    return number


class ModelSpec(SpecBase):
    """A GPT-style transformer, enough to estimate FLOPs, memory and layouts."""

    layers: Size = Field(description="transformer blocks")
    hidden_size: Size = Field(description="model width")
    heads: Size = Field(description="attention heads; must divide hidden_size")
    sequence_length: Size = Field(description="tokens per sequence")
    vocabulary: Size = Field(description="tokens in the vocabulary")
    global_batch: Size = Field(description="sequences per optimizer step")

    @model_validator(mode="after")
    def _heads_divide_hidden(self) -> ModelSpec:
        if self.hidden_size % self.heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not divisible by heads {self.heads}"
                f"{FIX_MARK}choose heads that divide hidden_size"
            )
        return self


class TaskSpec(SpecBase):
    """One training task. Either ``model`` (analytic estimate) or ``throughput`` (measured); a
    live task (``LiveTaskSpec``) may give neither: it is planned on an assumed curve until its
    first steps are measured (``planning.throughput.AssumedCurve``)."""

    # Whether a task of this kind may give neither ``model`` nor ``throughput``: only one whose
    # steps the coordinator measures (a live task); an offline plan has nothing to measure.
    MEASURED_LIVE: ClassVar[bool] = False

    name: str = Field(pattern=NAME_PATTERN, description="unique; letters, digits, '_', '.', '-'")
    weight: float = Field(
        gt=0, le=MAX_WEIGHT, allow_inf_nan=False, description="its share in the weighted FLOP/s (WAF)"
    )
    model: ModelSpec | None = Field(
        default=None, description="the model, for analytic throughput, memory and layouts (or throughput)"
    )
    throughput: dict[Workers, FlopRate] | None = Field(
        default=None,
        max_length=MAX_TABLE_ROWS,
        description="worker count (GPUs) -> achieved FLOP/s; a live task may leave it out: it is "
        "then planned on an assumed curve until its first steps are measured (docs/live-cluster.md)",
    )
    min_workers: Workers | None = Field(default=None, description="never run on fewer")
    worker_step: Workers | None = Field(
        default=None,
        description="usable counts are its multiples (without a throughput table; default 1)",
    )
    max_workers: Workers | None = Field(default=None, description="never run on more")
    current_workers: int = Field(
        default=0, ge=0, le=MAX_WORKERS, description="for planning only: workers it holds now"
    )
    # Only without a model, which tells us these (see docs/cost-model.md).
    state_bytes: float | None = Field(
        default=None,
        ge=0,
        le=MAX_STATE_BYTES,
        allow_inf_nan=False,
        description="without model: bytes of state to move",
    )
    replica_workers: Workers | None = Field(
        default=None, description="without model: workers holding one copy of the state"
    )
    iteration_seconds: float | None = Field(
        default=None, gt=0, le=MAX_SECONDS, allow_inf_nan=False, description="without model: seconds per step"
    )

    @field_validator("throughput", mode="before")
    @classmethod
    def _table(cls, value: Any) -> Any:
        if value is None:
            return None
        if not isinstance(value, Mapping) or not value:
            raise ValueError(
                "throughput must map worker counts to FLOP/s"
                f"{FIX_MARK}write e.g. 'throughput: {{8: 1.2e15, 16: 2.3e15}}'"
            )
        table: dict[int, float] = {}
        for key, rate in value.items():
            try:
                count = int(str(key))
            except ValueError:
                count = 0
            if count <= 0:
                raise ValueError(
                    f"worker count {key!r} is not a positive whole number"
                    f"{FIX_MARK}use GPU counts such as 8, 16, 32 as keys"
                )
            table[count] = _positive_number(rate, f"throughput at {count} workers")
        return table

    @model_validator(mode="after")
    def _consistent(self) -> TaskSpec:
        if self.model is not None and self.throughput is not None:
            raise ValueError(
                f"a task needs {'at most' if self.MEASURED_LIVE else 'exactly'} one of 'model' and "
                f"'throughput'{FIX_MARK}describe the model, or give a measured throughput table, not both"
            )
        if self.model is None and self.throughput is None and not self.MEASURED_LIVE:
            raise ValueError(
                "a task needs exactly one of 'model' and 'throughput'"
                f"{FIX_MARK}describe the model, or give a measured throughput table (a task submitted "
                "to a live cluster may give neither: it is measured as it runs)"
            )
        if self.throughput is not None and self.worker_step is not None:
            raise ValueError(
                "worker_step does not apply to a throughput table"
                f"{FIX_MARK}remove worker_step: the table's counts are the usable ones"
            )
        if self.model is not None:
            for name in ("state_bytes", "replica_workers", "iteration_seconds"):
                if getattr(self, name) is not None:
                    raise ValueError(
                        f"{name} is derived from the model"
                        f"{FIX_MARK}remove {name}, or use a throughput table instead of model"
                    )
        lo, hi = self.min_workers, self.max_workers
        if lo is not None and hi is not None and lo > hi:
            raise ValueError(
                f"min_workers {lo} is above max_workers {hi}{FIX_MARK}lower min_workers or raise max_workers"
            )
        step = self.step
        if lo is not None and lo % step:
            raise ValueError(
                f"min_workers {lo} is not a multiple of {self.step_named}{FIX_MARK}use a multiple of {step}"
            )
        if self.current_workers and not self.is_usable(self.current_workers):
            raise ValueError(
                f"current_workers {self.current_workers} is not a usable count for this task"
                f"{FIX_MARK}use 0 or one of: {self.describe_usable()}"
            )
        if self.throughput is not None and not any(self.is_usable(c) for c in self.throughput):
            raise ValueError(
                "no count in the throughput table lies within min_workers..max_workers"
                f"{FIX_MARK}widen the bounds or add table rows"
            )
        return self

    @property
    def step(self) -> int:
        return self.worker_step or 1

    @property
    def step_named(self) -> str:
        """Where the step comes from, for errors."""
        return f"worker_step {self.step}"

    @property
    def replica_size(self) -> int:
        """Workers placed and recovered together (one sharded copy of the model): 1 here; a live
        task's ``run.replica_size``."""
        return 1

    @property
    def minimum(self) -> int:
        if self.throughput is not None:
            table_min = min(self.throughput)
            return max(table_min, self.min_workers or table_min)
        return self.min_workers or self.step

    def is_usable(self, gpus: int) -> bool:
        """Whether the task can run on exactly ``gpus`` workers (memory aside)."""
        if gpus < self.minimum or (self.max_workers is not None and gpus > self.max_workers):
            return False
        if self.throughput is not None:
            return gpus in self.throughput
        return gpus % self.step == 0

    def describe_usable(self) -> str:
        if self.throughput is not None:
            return ", ".join(str(c) for c in sorted(self.throughput) if self.is_usable(c))
        top = "" if self.max_workers is None else f" up to {self.max_workers}"
        return f"multiples of {self.step} from {self.minimum}{top}"


class TaskList(SpecBase):
    tasks: list[TaskSpec] = Field(min_length=1)

    @field_validator("tasks", mode="after")
    @classmethod
    def _unique_names(cls, tasks: list[TaskSpec]) -> list[TaskSpec]:
        return unique_names(tasks)


_Task = TypeVar("_Task", bound=TaskSpec)


def unique_names(tasks: list[_Task]) -> list[_Task]:
    """``tasks`` if no two share a name (a validator of every list of tasks)."""
    seen: dict[str, int] = {}
    for index, task in enumerate(tasks):
        if task.name in seen:
            raise ValueError(
                f"task name {task.name!r} appears twice (entries {seen[task.name]} and "
                f"{index}){FIX_MARK}give every task its own name"
            )
        seen[task.name] = index
    return tasks


class TransitionSettings(SpecBase):
    """Inputs to the transition-time model D_trans (docs/cost-model.md gives the sources)."""

    node_loss_detection_s: float = Field(default=3.0, ge=0)
    process_failure_detection_s: float = Field(default=0.5, ge=0)
    reattempt_s: float = Field(default=1.0, ge=0)
    restart_process_s: float = Field(default=15.0, ge=0)
    reconfigure_s: float = Field(default=30.0, ge=0)
    same_node_replica_gbytes_per_s: float = Field(default=100.0, gt=0)
    other_node_replica_gbytes_per_s: float = Field(default=20.0, gt=0)
    host_memory_checkpoint_gbytes_per_s: float = Field(default=10.0, gt=0)
    persistent_checkpoint_gbytes_per_s: float = Field(default=2.0, gt=0)
    checkpoint_interval_s: float = Field(default=1800.0, gt=0)
    lost_iteration_fraction: float = Field(default=0.5, ge=0, le=1)


class PlannerSettings(SpecBase):
    granularity: Literal["auto", "gpu", "node"] = "auto"
    transition: TransitionSettings = TransitionSettings()


class NodeHardware(SpecBase):
    """What every node is made of and how reliable it is: the planner's hardware inputs."""

    gpu: str | float
    node_mtbf_hours: float = Field(gt=0, allow_inf_nan=False)
    gpu_memory_gib: float | None = Field(default=None, gt=0)
    nvlink_gbytes_per_s: float | None = Field(default=None, gt=0)
    network_gbytes_per_s: float | None = Field(default=None, gt=0)
    planner: PlannerSettings = PlannerSettings()

    @field_validator("gpu", mode="before")
    @classmethod
    def _gpu(cls, value: Any) -> Any:
        if isinstance(value, str) and lookup_gpu(value) is not None:
            return value
        if isinstance(value, str) and not re.fullmatch(r"[0-9.eE+-]+", value.strip()):
            known = ", ".join(g.name for g in KNOWN_GPUS.values())
            raise ValueError(
                f"unknown GPU {value!r}{FIX_MARK}use one of {known}, or its peak FLOP/s as a number"
            )
        return _positive_number(value, "gpu peak FLOP/s")

    def gpu_type(self) -> GpuType:
        base = lookup_gpu(self.gpu) if isinstance(self.gpu, str) else None
        if base is None:
            base = custom_gpu(float(self.gpu))
        return GpuType(
            base.name,
            base.peak_flops,
            base.memory_bytes if self.gpu_memory_gib is None else self.gpu_memory_gib * 1024**3,
            base.nvlink_bytes_per_s if self.nvlink_gbytes_per_s is None else self.nvlink_gbytes_per_s * 1e9,
            base.network_bytes_per_s
            if self.network_gbytes_per_s is None
            else self.network_gbytes_per_s * 1e9,
        )


class ClusterSpec(NodeHardware):
    """The cluster: identical nodes, numbered 0..nodes-1, and optionally who runs where."""

    nodes: int = Field(gt=0)
    gpus_per_node: int = Field(gt=0)
    assignment: dict[int, dict[str, int]] = Field(
        default_factory=dict, description="node id -> {task name: GPUs on that node}"
    )

    @field_validator("assignment", mode="before")
    @classmethod
    def _assignment_shape(cls, value: Any) -> Any:
        if value is None:
            return {}
        return value

    @field_validator("assignment", mode="after")
    @classmethod
    def _assignment_fits(
        cls, value: dict[int, dict[str, int]], info: ValidationInfo
    ) -> dict[int, dict[str, int]]:
        nodes, per_node = info.data.get("nodes"), info.data.get("gpus_per_node")
        if nodes is None or per_node is None:
            return value  # already reported
        for node, tasks in value.items():
            if not 0 <= node < nodes:
                raise ValueError(
                    f"assignment names node {node}, but nodes are 0..{nodes - 1}"
                    f"{FIX_MARK}use node ids below {nodes}"
                )
            for task, gpus in tasks.items():
                if gpus <= 0:
                    raise ValueError(
                        f"node {node} gives task {task!r} {gpus} GPUs"
                        f"{FIX_MARK}use a positive count, or leave the task out"
                    )
            if sum(tasks.values()) > per_node:
                raise ValueError(
                    f"node {node} is given {sum(tasks.values())} GPUs but has {per_node}"
                    f"{FIX_MARK}spread the workers over more nodes"
                )
        return value

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def workers_by_task(self) -> dict[str, int]:
        """Total GPUs per task in the current assignment."""
        totals: dict[str, int] = {}
        for tasks in self.assignment.values():
            for name, gpus in tasks.items():
                totals[name] = totals.get(name, 0) + gpus
        return totals


# ---------------------------------------------------------------- parsing and error rendering

_FIXES: dict[str, str] = {
    "missing": "add this field",
    "extra_forbidden": "remove it, or check its spelling against the documented fields",
    "greater_than": "use a larger value",
    "greater_than_equal": "use a larger value",
    "less_than_equal": "use a smaller value",
    "int_type": "write a whole number",
    "int_parsing": "write a whole number",
    "int_from_float": "write a whole number",
    "float_type": "write a number",
    "float_parsing": "write a number",
    "finite_number": "write a finite number",
    "less_than": "use a smaller value",
    "too_long": "write fewer entries",
    "string_too_long": "shorten it",
    "string_type": "write text",
    "string_pattern_mismatch": "use letters, digits, '.', '_' or '-' (at most 63 characters)",
    "list_type": "write a YAML list",
    "too_short": "add at least one entry",
    "dict_type": "write a YAML mapping",
    "model_type": "write a YAML mapping",
    "literal_error": "use one of the allowed values",
}


def _render_path(loc: tuple[int | str, ...], data: Any) -> str:
    parts: list[str] = []
    node = data
    for item in loc:
        if isinstance(item, str) and item in {"function-after", "function-before"}:
            continue
        if isinstance(item, int) and isinstance(node, list):
            label = f"[{item}]"
            entry = node[item] if 0 <= item < len(node) else None
            if isinstance(entry, Mapping) and isinstance(entry.get("name"), str):
                label += f"({entry['name']})"
            parts.append(label)
            node = entry
        else:
            parts.append(f".{item}" if parts else str(item))
            node = node.get(item) if isinstance(node, Mapping) else None
            if node is None and isinstance(item, str) and item.isdigit() and parts:
                node = None
    return "".join(parts)


def problems_from(error: ValidationError, data: Any) -> list[SpecProblem]:
    """Turn pydantic's errors into field paths, messages and fixes."""
    problems = []
    for item in error.errors(include_url=False):
        message = str(item["msg"]).removeprefix("Value error, ")
        fix = _FIXES.get(str(item["type"]), "correct the value")
        if FIX_MARK in message:
            message, fix = message.split(FIX_MARK, 1)
        elif item["type"] not in {"missing", "extra_forbidden"} and "input" in item:
            message = f"{message} (got {brief(item['input'])})"
        problems.append(SpecProblem(_render_path(tuple(item["loc"]), data), message, fix))
    return problems


def validate_spec(model: type[_M], data: Any, source: str) -> _M:
    if not isinstance(data, Mapping):
        raise SpecError(source, [SpecProblem("", "the file must hold a YAML mapping", "see examples/")])
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise SpecError(source, problems_from(exc, data)) from None


def parse_cluster(text: str, source: str = "<cluster>") -> ClusterSpec:
    return validate_spec(ClusterSpec, load_yaml_text(text, source), source)


def parse_tasks(text: str, source: str = "<tasks>") -> list[TaskSpec]:
    return list(validate_spec(TaskList, load_yaml_text(text, source), source).tasks)


def check_against_cluster(
    cluster: ClusterSpec, tasks: list[TaskSpec], cluster_source: str, tasks_source: str
) -> None:
    """Cross-file checks: the assignment names known tasks and agrees with current_workers."""
    names = {t.name: t for t in tasks}
    problems = []
    for node, entries in cluster.assignment.items():
        for name in entries:
            if name not in names:
                problems.append(
                    SpecProblem(
                        f"assignment.{node}.{name}",
                        f"task {name!r} is not in {tasks_source}",
                        "add the task there or remove it from the assignment",
                    )
                )
    if cluster.assignment:
        placed = cluster.workers_by_task()
        for task in tasks:
            have = placed.get(task.name, 0)
            if task.current_workers and task.current_workers != have:
                problems.append(
                    SpecProblem(
                        f"assignment ({task.name})",
                        f"places {have} GPUs but {tasks_source} says current_workers {task.current_workers}",
                        "make them agree, or drop current_workers",
                    )
                )
            if have and not task.is_usable(have):
                problems.append(
                    SpecProblem(
                        f"assignment ({task.name})",
                        f"places {have} GPUs, not a usable count for the task",
                        f"use 0 or one of: {task.describe_usable()}",
                    )
                )
    if problems:
        raise SpecError(cluster_source, problems)

"""Throughput curves A_t(x): achieved FLOP/s of a task on x GPUs.

Three kinds of curve share one interface, :class:`ThroughputCurve`:

- :class:`TableCurve`: a measured table; the task runs only at its counts.
- :class:`AnalyticCurve`: an estimate for a GPT model. For each count it searches data (d),
  tensor (t) and pipeline (p) parallel sizes and the micro-batch size (b) that fit in memory, and
  prices compute (GEMM efficiency grows with the hidden size), tensor-parallel
  all-reduces, pipeline sends, the 1F1B pipeline bubble and the data-parallel gradient all-reduce.
  Its three coefficients are fitted to Megatron-LM's published weak scaling (calibration.py).
- :class:`MeasuredCurve`: the seam for live tasks. Rates measured online replace the estimate at
  their counts and rescale it elsewhere, so a running task's plan follows what it really achieves.
- :class:`AssumedCurve`: a live task that declares neither, until it is measured: linear in its
  GPUs at an assumed rate per GPU (:func:`assumed_rate`), so that the plan divides GPUs by weight.

Curves are evaluated on numpy arrays of counts, so a 16,384-GPU cluster costs a few vector ops.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol

import numpy as np
import numpy.typing as npt

from unicron.core.gpus import GpuType
from unicron.core.specs import ModelSpec, TaskSpec
from unicron.planning.gpt import (
    BYTES_FP16,
    MODEL_STATE_BYTES_PER_PARAM,
    flops_per_iteration,
    model_state_bytes,
    parameter_count,
)

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
MICRO_BATCH_SIZES = (1, 2, 4, 8)


@dataclass(frozen=True)
class CurvePoints:
    """A curve evaluated at some counts. Unusable counts have rate 0."""

    gpus: IntArray
    rate: FloatArray  # achieved FLOP/s
    replica_gpus: IntArray  # GPUs that hold one full copy of the model state (t * p)
    state_bytes_per_gpu: FloatArray  # model + optimizer state each GPU holds
    iteration_s: FloatArray  # seconds per optimizer step (inf where unusable)

    def take(self, index: IntArray | list[int]) -> CurvePoints:
        """The points at the given positions, in that order."""
        at = np.asarray(index, dtype=np.int64)
        return CurvePoints(
            self.gpus[at],
            self.rate[at],
            self.replica_gpus[at],
            self.state_bytes_per_gpu[at],
            self.iteration_s[at],
        )


class ThroughputCurve(Protocol):
    def evaluate(self, gpus: IntArray) -> CurvePoints: ...


@dataclass(frozen=True)
class Coefficients:
    """The analytic model's fitted constants (see docs/throughput-model.md)."""

    gemm_efficiency: float  # fraction of peak that large GEMMs reach
    gemm_half_width: float  # hidden size at which GEMMs reach half of that
    comm_efficiency: float  # fraction of link bandwidth that collectives reach
    memory_usable: float = 0.9  # share of GPU memory the model may use (allocator, workspace)


# Fitted by `python bench/throughput_docs.py` on megatron_sc21_weak_scaling.csv.
DEFAULT_COEFFICIENTS = Coefficients(gemm_efficiency=0.645, gemm_half_width=608.4, comm_efficiency=0.6)


@dataclass(frozen=True)
class Layout:
    tensor: IntArray
    pipeline: IntArray
    data: IntArray
    micro_batch: IntArray


def iteration_model(
    model: ModelSpec,
    gpu: GpuType,
    gpus_per_node: int,
    layout: Layout,
    coeffs: Coefficients = DEFAULT_COEFFICIENTS,
) -> tuple[FloatArray, FloatArray]:
    """Seconds per iteration and bytes of memory per GPU for the given layouts (arrays)."""
    t = layout.tensor.astype(np.float64)
    p = layout.pipeline.astype(np.float64)
    d = layout.data.astype(np.float64)
    b = layout.micro_batch.astype(np.float64)
    h, s, layers = model.hidden_size, model.sequence_length, model.layers
    params = parameter_count(model)
    flops = flops_per_iteration(model)
    # Replicas may hold unequal shares of the global batch (the survivors of a failure share
    # out its micro-batches); an iteration waits for the replica with the most.
    micro_batches = np.ceil(model.global_batch / (d * b))

    # Tensor parallelism splits a GEMM's output columns; its inner dimension stays h, so GEMM
    # efficiency follows h (fitting on h / t instead doubles the calibration error).
    efficiency = coeffs.gemm_efficiency * h / (h + coeffs.gemm_half_width)
    compute = flops / model.global_batch * b / (t * p) / (gpu.peak_flops * efficiency)

    nvlink = gpu.nvlink_bytes_per_s * coeffs.comm_efficiency
    network = gpu.network_bytes_per_s * coeffs.comm_efficiency
    activation = b * s * h * BYTES_FP16
    # Six all-reduces per layer and micro-batch: two each in forward, recomputed forward, backward.
    tp_link = np.where(t <= gpus_per_node, nvlink, network)
    tensor_comm = (layers / p) * 6 * 2 * (t - 1) / t * activation / tp_link
    # Activations forward and their gradients backward; scatter/gather splits them over t.
    pp_link = np.where(t * p <= gpus_per_node, nvlink, network)
    pipe_comm = np.where(p > 1, 2 * activation / t / pp_link, 0.0)
    stage = compute + tensor_comm + pipe_comm
    pipeline = (micro_batches + p - 1) * stage  # 1F1B: p - 1 stage times of bubble

    grad_bytes = BYTES_FP16 * params / (t * p)
    dp_link = np.where(d * t * p <= gpus_per_node, nvlink, network)
    data_comm = np.where(d > 1, 2 * (d - 1) / d * grad_bytes / dp_link, 0.0)
    seconds = pipeline + data_comm

    states = MODEL_STATE_BYTES_PER_PARAM * params / (t * p)
    in_flight = np.minimum(p, micro_batches)
    stored_inputs = (layers / p) * activation * in_flight  # full recomputation keeps layer inputs
    # One layer's full activations while it is recomputed (Korthikanti et al. 2022, eq. 2).
    working = s * b * h * (34 + 5 * model.heads * s / h) / t
    logits = s * b * model.vocabulary * 6 / t  # fp16 logits and fp32 loss gradient
    memory = states + stored_inputs + working + logits
    return seconds, memory


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


@lru_cache(maxsize=256)
def _candidates(model: ModelSpec, gpus_per_node: int, max_tensor: int) -> tuple[tuple[int, int, int], ...]:
    tensor = [t for t in _divisors(model.heads) if t <= min(gpus_per_node, max_tensor)]
    pipeline = _divisors(model.layers)
    return tuple((t, p, b) for t in tensor for p in pipeline for b in MICRO_BATCH_SIZES)


def best_layouts(
    model: ModelSpec,
    gpu: GpuType,
    gpus_per_node: int,
    gpus: IntArray,
    coeffs: Coefficients = DEFAULT_COEFFICIENTS,
    max_tensor: int = 1 << 30,
) -> tuple[FloatArray, Layout]:
    """The best achieved FLOP/s at each count and the layout reaching it (0 where none fits)."""
    n = len(gpus)
    best = np.zeros(n)
    chosen = [np.zeros(n, dtype=np.int64) for _ in range(4)]
    capacity = gpu.memory_bytes * coeffs.memory_usable
    flops = flops_per_iteration(model)
    for t, p, b in _candidates(model, gpus_per_node, max_tensor):
        valid = (gpus % (t * p) == 0) & (gpus > 0)
        data = np.where(valid, gpus // (t * p), 1)
        valid &= data * b <= model.global_batch  # at least one micro-batch per replica
        if not valid.any():
            continue
        layout = Layout(
            np.full(n, t, dtype=np.int64),
            np.full(n, p, dtype=np.int64),
            data,
            np.full(n, b, dtype=np.int64),
        )
        seconds, memory = iteration_model(model, gpu, gpus_per_node, layout, coeffs)
        rate = np.where(valid & (memory <= capacity), flops / seconds, 0.0)
        better = rate > best
        best = np.where(better, rate, best)
        for slot, value in zip(
            chosen, (layout.tensor, layout.pipeline, data, layout.micro_batch), strict=True
        ):
            slot[better] = value[better]
    return best, Layout(*chosen)


@dataclass(frozen=True)
class AnalyticCurve:
    """Estimated A(x) for a GPT model on a given GPU type."""

    model: ModelSpec
    gpu: GpuType
    gpus_per_node: int
    coeffs: Coefficients = DEFAULT_COEFFICIENTS
    max_tensor: int = 1 << 30  # systems without tensor parallelism are modelled with 1

    def evaluate(self, gpus: IntArray) -> CurvePoints:
        top = int(gpus.max(initial=0))
        # Evaluate every count up to a power of two once and index into it: the planner asks
        # for the same curve at every event, and the layout search dominates its cost.
        full = _analytic_points(self, 1 << max(top, 1).bit_length())
        return CurvePoints(
            gpus,
            full.rate[gpus],
            full.replica_gpus[gpus],
            full.state_bytes_per_gpu[gpus],
            full.iteration_s[gpus],
        )

    def _evaluate_range(self, top: int) -> CurvePoints:
        gpus = np.arange(top + 1, dtype=np.int64)
        rate, layout = best_layouts(
            self.model, self.gpu, self.gpus_per_node, gpus, self.coeffs, self.max_tensor
        )
        replica = np.where(rate > 0, layout.tensor * layout.pipeline, 0).astype(np.int64)
        state = np.where(
            rate > 0,
            model_state_bytes(self.model) / np.maximum(replica, 1),
            0.0,
        )
        iteration = np.divide(
            flops_per_iteration(self.model), rate, out=np.full(len(gpus), np.inf), where=rate > 0
        )
        return CurvePoints(gpus, rate, replica, state, iteration)


@lru_cache(maxsize=128)
def _analytic_points(curve: AnalyticCurve, top: int) -> CurvePoints:
    return curve._evaluate_range(top)


@dataclass(frozen=True)
class TableCurve:
    """A measured table: the task runs only at the listed counts."""

    table: tuple[tuple[int, float], ...]
    state_bytes: float = 0.0  # whole model + optimizer state; 0 when unknown
    replica_gpus: int | None = None  # GPUs per model copy; defaults to the smallest count
    iteration_s: float | None = None

    def evaluate(self, gpus: IntArray) -> CurvePoints:
        lookup = dict(self.table)
        rate = np.array([lookup.get(int(g), 0.0) for g in gpus], dtype=np.float64)
        replica_size = self.replica_gpus or min(lookup)
        replica = np.where(rate > 0, replica_size, 0).astype(np.int64)
        state = np.where(rate > 0, self.state_bytes / replica_size, 0.0)
        seconds = np.inf if self.iteration_s is None else self.iteration_s
        iteration = np.where(rate > 0, seconds, np.inf)
        return CurvePoints(gpus, rate, replica, state, iteration)


@dataclass(frozen=True)
class MeasuredCurve:
    """Live measurements layered on an estimate.

    At a measured count the measurement is used as is. Elsewhere the estimate is scaled by the
    ratio measured/estimated at the nearest measured count, so one measurement corrects the whole
    curve's level while the estimate keeps its shape. ``in_samples``: the task's FLOPs per sample
    are unknown, so its rates were measured in samples/s and put on the estimate's level
    (:func:`on_level`): they tell how it scales, not how much work it does.
    """

    base: ThroughputCurve
    measured: tuple[tuple[int, float], ...]
    in_samples: bool = False

    def evaluate(self, gpus: IntArray) -> CurvePoints:
        points = self.base.evaluate(gpus)
        if not self.measured:
            return points
        counts = np.array([c for c, _ in self.measured], dtype=np.int64)
        values = np.array([r for _, r in self.measured], dtype=np.float64)
        at_counts = self.base.evaluate(counts).rate
        ratio = np.divide(values, at_counts, out=np.ones_like(values), where=at_counts > 0)
        nearest = np.abs(gpus[:, None] - counts[None, :]).argmin(axis=1)
        scaled = points.rate * ratio[nearest]
        exact = gpus[:, None] == counts[None, :]
        hit = exact.any(axis=1)
        rate = np.where(hit & (points.rate > 0), values[exact.argmax(axis=1)], scaled)
        rate = np.where(points.rate > 0, rate, 0.0)
        iteration = points.iteration_s * np.divide(points.rate, rate, out=np.ones_like(rate), where=rate > 0)
        return CurvePoints(gpus, rate, points.replica_gpus, points.state_bytes_per_gpu, iteration)


@dataclass(frozen=True)
class ScaledCurve:
    """An estimate put on the level the cluster measures: every rate times ``factor``."""

    base: ThroughputCurve
    factor: float

    def evaluate(self, gpus: IntArray) -> CurvePoints:
        p = self.base.evaluate(gpus)
        return CurvePoints(
            p.gpus, p.rate * self.factor, p.replica_gpus, p.state_bytes_per_gpu, p.iteration_s / self.factor
        )


# A task that declares no throughput, with nothing measured or declared on its cluster to compare
# it with, is assumed to reach this share of its GPUs' peak: the lowest share in Megatron-LM's weak
# scaling (135 of 312 TFLOP/s per A100; data/megatron_sc21_weak_scaling.csv, embedded in
# calibration.py as MEGATRON_SC21; tests/test_unmeasured_tasks.py checks the two agree).
ASSUMED_PEAK_FRACTION = 0.43


@dataclass(frozen=True)
class AssumedRate:
    """What a task that declares no throughput is assumed to achieve per GPU until it is
    measured, and where that figure comes from (in a user's words)."""

    per_gpu: float  # FLOP/s
    source: str


def assumed_rate(
    gpu: GpuType,
    measured: Iterable[Mapping[int, float]] = (),
    declared: Iterable[Mapping[int, float]] = (),
) -> AssumedRate:
    """The rate per GPU a task that declares no throughput is planned with until its own steps
    are measured, compared like for like with the cluster's other tasks: the geometric mean per
    GPU of every rate measured on this cluster (FLOP/s, any task); with none, of the other tasks'
    throughput tables; with none, ``ASSUMED_PEAK_FRACTION`` of the GPU's peak."""
    for tables, source in (
        (measured, "what this cluster's measured tasks achieve per GPU"),
        (declared, "what the other tasks' throughput tables declare per GPU"),
    ):
        per_gpu = [
            rate / count for table in tables for count, rate in table.items() if rate > 0 and count > 0
        ]
        if per_gpu:
            return AssumedRate(float(np.exp(np.mean(np.log(per_gpu)))), f"{source} (geometric mean)")
    fraction = f"{ASSUMED_PEAK_FRACTION:.0%}"
    return AssumedRate(
        gpu.peak_flops * ASSUMED_PEAK_FRACTION, f"{fraction} of the GPU's peak {flops(gpu.peak_flops)}"
    )


@dataclass(frozen=True)
class AssumedCurve:
    """A task that declares no throughput, before it is measured: ``assumed.per_gpu`` FLOP/s on
    each of its GPUs. Linear, as nothing says how it scales; the plan then divides GPUs between
    such tasks by their weights, and a first measurement replaces it (``MeasuredCurve``)."""

    assumed: AssumedRate
    state_bytes: float = 0.0  # whole model + optimizer state; 0 when unknown
    replica_gpus: int = 1  # GPUs per model copy
    iteration_s: float | None = None

    def evaluate(self, gpus: IntArray) -> CurvePoints:
        rate = np.where(gpus > 0, gpus * self.assumed.per_gpu, 0.0).astype(np.float64)
        replica = np.where(rate > 0, self.replica_gpus, 0).astype(np.int64)
        state = np.where(rate > 0, self.state_bytes / self.replica_gpus, 0.0)
        seconds = np.inf if self.iteration_s is None else self.iteration_s
        iteration = np.where(rate > 0, seconds, np.inf)
        return CurvePoints(gpus, rate, replica, state, iteration)


def declares(task: TaskSpec) -> bool:
    """Whether the task declares its throughput (a table, or a model to estimate it from)."""
    return task.model is not None or task.throughput is not None


def estimate_for(
    task: TaskSpec, gpu: GpuType, gpus_per_node: int, assumed: AssumedRate | None = None
) -> ThroughputCurve:
    """The task's own estimate: its model's analytic curve, or the table its file declares; a
    task that declares neither: linear at ``assumed`` (by default :func:`assumed_rate` with
    nothing else known)."""
    if task.model is not None:
        return AnalyticCurve(task.model, gpu, gpus_per_node)
    if task.throughput is None:
        return AssumedCurve(
            assumed or assumed_rate(gpu),
            task.state_bytes or 0.0,
            task.replica_workers or task.replica_size,
            task.iteration_seconds,
        )
    return TableCurve(
        tuple(sorted(task.throughput.items())),
        task.state_bytes or 0.0,
        task.replica_workers,
        task.iteration_seconds,
    )


def curve_for(
    task: TaskSpec,
    gpu: GpuType,
    gpus_per_node: int,
    measured: Mapping[int, float] | None = None,
) -> ThroughputCurve:
    """The curve the planner uses for one task, with live measurements if there are any."""
    base = estimate_for(task, gpu, gpus_per_node)
    if measured:
        return MeasuredCurve(base, tuple(sorted(measured.items())))
    return base


def calibration(measured: Iterable[tuple[ThroughputCurve, Mapping[int, float]]]) -> float:
    """How far this cluster's measurements sit from the estimates: the geometric mean of
    measured / estimated over every measured point (1.0 with none). Estimates are guesses of the
    same kind (a declared table, a model's analytic curve) and err alike on one cluster; a task
    not yet measured is put on this level, so that it is compared with a measured one like for
    like. Without it a running task measured at 0.38 GFLOP/s was stopped for a waiting one that
    declared 3.6e9 for the same program (the declaration as optimistic as the first's had been)."""
    logs = []
    for estimate, points in measured:
        counts = np.array(sorted(points), dtype=np.int64)
        if not len(counts):
            continue
        expected = estimate.evaluate(counts).rate
        for rate, guess in zip((points[int(c)] for c in counts), expected, strict=True):
            if rate > 0 and guess > 0:
                logs.append(np.log(rate / guess))
    return float(np.exp(np.mean(logs))) if logs else 1.0


def on_level(estimate: ThroughputCurve, samples: Mapping[int, float]) -> ThroughputCurve:
    """Rates measured in samples/s (a task whose FLOPs per sample are unknown) as a curve in
    FLOP/s: scaled by one factor so that their geometric mean equals the estimate's at the same
    counts. They then give the task's scaling (how its rate changes with its GPUs) while its
    level stays the estimate's: at one measured count the curve is the estimate."""
    counts = np.array(sorted(samples), dtype=np.int64)
    values = np.array([samples[int(c)] for c in counts], dtype=np.float64)
    expected = estimate.evaluate(counts).rate
    valid = (values > 0) & (expected > 0)
    if not valid.any():
        return estimate
    factor = float(np.exp(np.mean(np.log(expected[valid] / values[valid]))))
    points = tuple((int(c), float(v * factor)) for c, v, ok in zip(counts, values, valid, strict=True) if ok)
    return MeasuredCurve(estimate, points, in_samples=True)


def curves_for(
    tasks: Iterable[TaskSpec],
    gpu: GpuType,
    gpus_per_node: int,
    measured: Mapping[str, Mapping[int, float]],
    samples: Mapping[str, Mapping[int, float]] | None = None,
) -> dict[str, ThroughputCurve]:
    """Every task's curve, compared like for like: a measured task's estimate corrected by its
    own measurements (``MeasuredCurve``); an unmeasured one's declared estimate scaled by the
    cluster's :func:`calibration`; a task that declares none, linear at :func:`assumed_rate` until
    measured. A measured task that declares none is calibrated against the rate it was assumed
    to have before anything was measured (the declared tables' level per GPU, or the GPU's
    peak's share): its measurement says how far this cluster sits from declarations too.
    ``samples``: rates in samples/s of tasks whose FLOPs per sample are unknown: their scaling,
    on their estimate's level (:func:`on_level`)."""
    tasks = list(tasks)
    tables = [t.throughput for t in tasks if t.throughput is not None]
    seen = {t.name: dict(measured[t.name]) for t in tasks if measured.get(t.name)}
    prior = assumed_rate(gpu, (), tables)  # before any measurement
    estimates = {t.name: estimate_for(t, gpu, gpus_per_node, prior) for t in tasks}
    factor = calibration((estimates[name], points) for name, points in seen.items())
    assumed = assumed_rate(gpu, seen.values(), tables)
    curves: dict[str, ThroughputCurve] = {}
    for task in tasks:
        name, declared = task.name, declares(task)
        base = estimates[name] if declared else estimate_for(task, gpu, gpus_per_node, assumed)
        if name in seen:
            curves[name] = MeasuredCurve(base, tuple(sorted(seen[name].items())))
            continue
        level = ScaledCurve(base, factor) if declared and factor != 1.0 else base
        relative = (samples or {}).get(name)
        curves[name] = on_level(level, relative) if relative else level
    return curves


def is_assumed(curve: ThroughputCurve) -> bool:
    """Whether the curve's level is an assumption: a task that declares no throughput, not yet
    measured, or measured only in samples/s."""
    if isinstance(curve, MeasuredCurve):
        return curve.in_samples and isinstance(curve.base, AssumedCurve)
    return isinstance(curve, AssumedCurve)


def basis(curve: ThroughputCurve) -> str:
    """Where a curve's rates come from, in a user's words."""
    if isinstance(curve, MeasuredCurve) and curve.in_samples:
        base = curve.base
        level = (
            f"assumed {flops(base.assumed.per_gpu)} per GPU, {base.assumed.source}"
            if isinstance(base, AssumedCurve)
            else basis(base)
        )
        return f"scaling measured in samples/s (no FLOPs per sample), level {level}"
    if isinstance(curve, MeasuredCurve):
        return "measured"
    if isinstance(curve, ScaledCurve):
        return f"declared, scaled x{curve.factor:.3g} to what this cluster measures"
    if isinstance(curve, AssumedCurve):
        return f"not measured yet: assumed {flops(curve.assumed.per_gpu)} per GPU, {curve.assumed.source}"
    return "declared"


def flops(rate: float) -> str:
    """A FLOP/s figure with an SI prefix: 3.2 PFLOP/s, 180 GFLOP/s."""
    for scale, prefix in ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M")):
        if abs(rate) >= scale:
            return f"{rate / scale:.3g} {prefix}FLOP/s"
    return f"{rate:.3g} FLOP/s"

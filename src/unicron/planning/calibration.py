"""Calibration of the analytic throughput model on Megatron-LM's published weak scaling.

The reference rows are Table 1 of Narayanan et al. (SC'21, arXiv 2104.04473), the same data as
the repository's ``data/megatron_sc21_weak_scaling.csv`` (a test checks the copies agree). Each row gives a
model, its tensor/pipeline layout, GPU count, global batch and achieved TFLOP/s per GPU on A100s.
The paper tuned the micro-batch size per row and did not print it, so each row is evaluated at its
best micro-batch size. The fit is a grid search minimising the squared log error.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from unicron.core.gpus import KNOWN_GPUS
from unicron.core.specs import ModelSpec
from unicron.planning.gpt import flops_per_iteration
from unicron.planning.throughput import (
    DEFAULT_COEFFICIENTS,
    MICRO_BATCH_SIZES,
    Coefficients,
    Layout,
    iteration_model,
)

SEQUENCE = 2048
VOCABULARY = 51200
GPUS_PER_NODE = 8

# params_billion, heads, hidden, layers, tp, pp, gpus, global_batch, tflops_per_gpu
MEGATRON_SC21: tuple[tuple[float, int, int, int, int, int, int, int, float], ...] = (
    (1.7, 24, 2304, 24, 1, 1, 32, 512, 137),
    (3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
    (7.5, 32, 4096, 36, 4, 1, 128, 512, 142),
    (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
    (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138),
    (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
    (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148),
    (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
    (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163),
    (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163),
)


@dataclass(frozen=True)
class RowResult:
    params_billion: float
    gpus: int
    tensor: int
    pipeline: int
    micro_batch: int
    measured_tflops: float
    predicted_tflops: float

    @property
    def error(self) -> float:
        """Relative error of the prediction (positive: we over-estimate)."""
        return self.predicted_tflops / self.measured_tflops - 1


def reference_model(row: tuple[float, int, int, int, int, int, int, int, float]) -> ModelSpec:
    _, heads, hidden, layers, _, _, _, batch, _ = row
    return ModelSpec(
        layers=layers,
        hidden_size=hidden,
        heads=heads,
        sequence_length=SEQUENCE,
        vocabulary=VOCABULARY,
        global_batch=batch,
    )


def evaluate_rows(coeffs: Coefficients = DEFAULT_COEFFICIENTS) -> list[RowResult]:
    """Predict every reference row at its published layout and its best micro-batch size."""
    gpu = KNOWN_GPUS["a100"]
    results = []
    for row in MEGATRON_SC21:
        model = reference_model(row)
        params, _, _, _, tp, pp, gpus, batch, measured = row
        data = gpus // (tp * pp)
        sizes = np.array([b for b in MICRO_BATCH_SIZES if batch % (data * b) == 0])
        n = len(sizes)
        layout = Layout(
            np.full(n, tp, dtype=np.int64),
            np.full(n, pp, dtype=np.int64),
            np.full(n, data, dtype=np.int64),
            sizes.astype(np.int64),
        )
        seconds, memory = iteration_model(model, gpu, GPUS_PER_NODE, layout, coeffs)
        fits = memory <= gpu.memory_bytes * coeffs.memory_usable
        tflops = np.where(fits, flops_per_iteration(model) / seconds / gpus / 1e12, 0.0)
        best = int(tflops.argmax())
        results.append(RowResult(params, gpus, tp, pp, int(sizes[best]), measured, float(tflops[best])))
    return results


def fit_error(coeffs: Coefficients) -> float:
    errors = [
        np.log(r.predicted_tflops / r.measured_tflops) if r.predicted_tflops > 0 else 10.0
        for r in evaluate_rows(coeffs)
    ]
    return float(np.mean(np.square(errors)))


def fit() -> Coefficients:
    """Grid search over the three coefficients, then a finer grid around the best point."""
    gemm = np.linspace(0.45, 0.95, 26)
    half = np.geomspace(10, 2000, 24)
    comm = np.linspace(0.3, 1.0, 15)
    best = min(
        (Coefficients(float(g), float(w), float(c)) for g, w, c in itertools.product(gemm, half, comm)),
        key=fit_error,
    )
    fine = itertools.product(
        np.linspace(best.gemm_efficiency - 0.02, best.gemm_efficiency + 0.02, 9),
        np.linspace(best.gemm_half_width * 0.85, best.gemm_half_width * 1.15, 9),
        np.clip(np.linspace(best.comm_efficiency - 0.05, best.comm_efficiency + 0.05, 5), 0.05, 1),
    )
    refined = min((Coefficients(float(g), float(w), float(c)) for g, w, c in fine), key=fit_error)
    return Coefficients(
        round(refined.gemm_efficiency, 3),
        round(refined.gemm_half_width, 1),
        round(refined.comm_efficiency, 3),
    )

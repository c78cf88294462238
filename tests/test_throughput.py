"""The throughput model: calibration error, curve shape, and the seam for measured rates."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from unicron.core.gpus import KNOWN_GPUS
from unicron.core.specs import ModelSpec
from unicron.planning.calibration import MEGATRON_SC21, evaluate_rows, fit, fit_error
from unicron.planning.throughput import (
    DEFAULT_COEFFICIENTS,
    AnalyticCurve,
    MeasuredCurve,
    TableCurve,
)

from .conftest import DATA

A100 = KNOWN_GPUS["a100"]
GPT3 = {
    "1.3b": ModelSpec(
        layers=24, hidden_size=2048, heads=16, sequence_length=2048, vocabulary=51200, global_batch=512
    ),
    "13b": ModelSpec(
        layers=40, hidden_size=5120, heads=40, sequence_length=2048, vocabulary=51200, global_batch=1024
    ),
    "175b": ModelSpec(
        layers=96, hidden_size=12288, heads=96, sequence_length=2048, vocabulary=51200, global_batch=1536
    ),
}


def test_embedded_reference_matches_the_data_csv() -> None:
    path = DATA / "megatron_sc21_weak_scaling.csv"
    assert path.exists(), f"{path}: the repository's data/ folder"
    rows = [r for r in csv.reader(line for line in path.open() if not line.startswith("#"))][1:]
    assert [tuple(float(x) for x in r[:-1]) for r in rows] == [
        tuple(float(x) for x in row) for row in MEGATRON_SC21
    ]


def test_calibration_error_is_small() -> None:
    errors = [abs(r.error) for r in evaluate_rows()]
    assert max(errors) < 0.10
    assert float(np.mean(errors)) < 0.04


def test_default_coefficients_are_the_fit() -> None:
    # Refitting must not find a clearly better point: the defaults are the published fit.
    assert fit_error(DEFAULT_COEFFICIENTS) <= fit_error(fit()) * 1.05


def test_curves_are_not_linear_and_differ_by_model() -> None:
    gpus = np.array([64, 128, 256, 512, 1024])
    per_gpu = {}
    for name, model in GPT3.items():
        rate = AnalyticCurve(model, A100, 8).evaluate(gpus).rate
        per_gpu[name] = rate / gpus
    small = per_gpu["1.3b"]
    assert (small > 0).all()
    # Sub-linear: achieved FLOP/s per GPU falls as GPUs are added under a fixed global batch.
    assert small[-1] < 0.9 * small[0]
    # Bigger models use each GPU better at the same count where both fit.
    assert per_gpu["13b"][2] > per_gpu["1.3b"][2]


def test_model_that_does_not_fit_gets_zero() -> None:
    rate = AnalyticCurve(GPT3["175b"], A100, 8).evaluate(np.array([8, 16])).rate
    assert (rate == 0).all()


def test_table_curve_runs_only_at_listed_counts() -> None:
    curve = TableCurve(((8, 1e15), (16, 1.8e15)), state_bytes=16e9)
    points = curve.evaluate(np.array([0, 8, 12, 16]))
    assert points.rate.tolist() == [0, 1e15, 0, 1.8e15]
    assert points.replica_gpus.tolist() == [0, 8, 0, 8]
    assert points.state_bytes_per_gpu[1] == pytest.approx(2e9)


def test_measured_rates_replace_and_rescale_the_estimate() -> None:
    base = AnalyticCurve(GPT3["13b"], A100, 8)
    gpus = np.array([32, 64, 128])
    estimate = base.evaluate(gpus).rate
    measured = MeasuredCurve(base, ((64, estimate[1] * 0.5),)).evaluate(gpus).rate
    assert measured[1] == pytest.approx(estimate[1] * 0.5)
    assert measured[0] == pytest.approx(estimate[0] * 0.5)
    assert measured[2] == pytest.approx(estimate[2] * 0.5)

"""The failure rate by cluster size (``sim/interruptions.py``): the fitted power law against the
published figures, and a scenario whose trace fails at it."""

from __future__ import annotations

import pytest

from unicron.core.errors import SpecError
from unicron.sim.interruptions import FIT, PUBLISHED, job_mtbi_hours, node_mtbf_hours
from unicron.sim.runner import scenario_trace
from unicron.sim.scenario import parse_scenario

SCENARIO = """name: t
days: {days}
cluster: {{nodes: 16, gpus_per_node: 8, gpu: A100, node_mtbf_hours: 1000}}
tasks: [{{name: a, weight: 1, throughput: {{8: 1.0e9, 128: 1.0e11}}}}]
trace: {{rate: published, seed: 3{extra}}}
"""


def test_the_fit_is_within_twice_of_every_published_figure() -> None:
    for gpus, hours in PUBLISHED:
        assert 0.5 <= job_mtbi_hours(gpus) / hours <= 2.0, (gpus, hours, FIT)
    # Sub-linear: a job 16 times larger is interrupted fewer than 16 times as often.
    assert job_mtbi_hours(1024) / job_mtbi_hours(16384) < 16
    with pytest.raises(ValueError, match="at least one GPU"):
        job_mtbi_hours(0)


def test_a_published_rate_fails_a_cluster_as_often_as_a_job_its_size_is_interrupted() -> None:
    days = 365
    scenario = parse_scenario(SCENARIO.format(days=days, extra=""), "t.yaml")
    expected = days * 24 / job_mtbi_hours(128)  # one task on all 128 GPUs: about 100 a year
    assert scenario.trace.node_mtbf(scenario.cluster) == pytest.approx(node_mtbf_hours(16, 8))
    assert 0.7 * expected <= len(scenario_trace(scenario)) <= 1.3 * expected


def test_a_published_rate_and_a_node_mtbf_or_a_count_together_are_refused_by_name() -> None:
    with pytest.raises(SpecError) as info:
        parse_scenario(SCENARIO.format(days=1, extra=", node_mtbf_hours: 500"), "t.yaml")
    assert any("rate: published" in p.message and "drop" in p.fix for p in info.value.problems), info.value
    with pytest.raises(SpecError) as info:
        parse_scenario(SCENARIO.format(days=1, extra=", count: 3"), "t.yaml")
    assert any("count places exactly" in p.message for p in info.value.problems), info.value

"""The demo's live-against-simulated WAF comparison (pure parts; `make demo` runs the rest)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from unicron.cli import demo_waf
from unicron.core.livespecs import parse_live_cluster, parse_live_tasks
from unicron.core.specs import TransitionSettings
from unicron.core.taxonomy import ErrorKind

DEMO = Path("examples/demo/tasks.yaml")
CLUSTER = Path("examples/demo/cluster.yaml")


def test_recorder_turns_weighted_flop_into_waf() -> None:
    recorder = demo_waf.WafRecorder(started=100.0)
    for i in range(11):  # 2e9 weighted FLOP per second, then nothing
        flop = 2e9 * min(i, 6)
        recorder.record(100.0 + i, [{"name": "a", "weighted_flop": flop, "workers": 2, "state": "running"}])
    t, waf = recorder.waf(window_s=2.0)
    assert waf[4] == pytest.approx(2e9) and waf[10] == 0.0
    assert demo_waf.phase_means(t, waf, [2.0, 6.0, 11.0])[0] == pytest.approx(2e9)


def test_measured_rates_and_transition_times_come_from_events() -> None:
    events = [
        {"kind": "throughput_measured", "task": "a", "time": 1.0, "detail": {"workers": 4, "flops": 1.0e9}},
        {"kind": "throughput_measured", "task": "a", "time": 2.0, "detail": {"workers": 4, "flops": 3.0e9}},
        {"kind": "throughput_measured", "task": "a", "time": 3.0, "detail": {"workers": 4, "flops": 2.0e9}},
        {"kind": "task_launch", "task": "a", "time": 10.0, "detail": {"generation": 1}},
        {"kind": "task_running", "task": "a", "time": 14.0, "detail": {"generation": 1}},
        {"kind": "task_launch", "task": "a", "time": 50.0, "detail": {"generation": 2}},
        {"kind": "task_running", "task": "a", "time": 52.0, "detail": {"generation": 2}},
        {"kind": "task_grown", "task": "a", "time": 30.0, "detail": {"waited_s": 3.0}},
        {"kind": "node_lost", "task": None, "time": 40.0, "detail": {"silent_s": 2.5}},
    ]
    assert demo_waf.measured_rates(events) == {"a": {4: 2.0e9}}  # the median
    tasks = [{"started": 0.0, "finished": 100.0, "step": 500}]
    got = demo_waf.transition_from_events(events, tasks, checkpoint_every=25)
    # The relaunch (2 s), not the first launch (4 s, every task starting at once).
    assert (got.restart_process_s, got.reconfigure_s, got.node_loss_detection_s) == (2.0, 3.0, 2.5)
    assert got.checkpoint_interval_s == pytest.approx(5.0)


def test_simulated_waf_drops_while_a_node_is_lost() -> None:
    specs = parse_live_tasks(DEMO.read_text(), str(DEMO))
    loss = demo_waf.LiveFailure(60.0, {"alpha": 2}, ErrorKind.NODE_LOST, 25.0)
    transition = TransitionSettings(reconfigure_s=4.0, restart_process_s=5.0, checkpoint_interval_s=10.0)
    hardware = parse_live_cluster(CLUSTER.read_text(), str(CLUSTER))
    t, waf, tables = demo_waf.predicted(specs, hardware, {}, 4, 2, [loss], 140.0, 140, transition)
    before, during, after = demo_waf.phase_means(t, waf, [10.0, 60.0, 85.0, 140.0])
    assert during < before and after > during
    assert tables["alpha"] == {2: 2.0e9, 4: 3.8e9}  # nothing measured: the declared table
    assert np.all(waf >= 0)


def test_the_docs_demo_section_is_what_the_demo_run_wrote() -> None:
    """docs/live-cluster.md is rendered by bench/demo_docs.py from the demo run's figures (also
    committed, docs/bench/demo-waf.json): no number in it is typed by hand."""
    from bench.demo_docs import render

    comparison = json.loads(Path("docs/bench/demo-waf.json").read_text())
    assert Path("docs/live-cluster.md").read_text() == render(comparison)

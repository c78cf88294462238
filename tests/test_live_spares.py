"""Hot spares through real processes: an idle slot holds a started worker, and a grow uses it.

One task that can use 3 of 4 slots: the fourth holds a hot spare for it. A worker is killed; the
survivors shrink in place, and the grow back to 3 takes the spare (a new identity, state from a
live replica) instead of starting a process; a new spare then takes the freed slot. The run ends
with every step's global batch exact and the parameters of a failure-free run.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from unicron.control.localcluster import LocalCluster
from unicron.train.checkpoint import load_latest
from unicron.train.data import global_batch_ids

from .test_live_cluster import ARGS, TRAIN, assert_same_parameters, reference

ITERATIONS = 60


@pytest.mark.timeout(420)
def test_a_grow_uses_the_hot_spare(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    program = ", ".join(["python", str(TRAIN), *ARGS, "--step-delay", "0.1"])
    spec = (
        f"name: lm\nweight: 1\nthroughput: {{2: 1.9e9, 3: 2.7e9}}\nrun:\n  program: [{program}]\n"
        f"  iterations: {ITERATIONS}\n  checkpoint_every: 10\n  env: {{UNICRON_TRACE_FILE: {trace}}}\n"
    )
    with LocalCluster(tmp_path / "cluster", nodes=2, slots=2) as cluster:
        cluster.submit(spec)

        def kinds() -> list[str]:
            return [e["kind"] for e in cluster.get("/v1/events", task="lm")]

        cluster.wait(
            lambda: "spare_launched" in kinds() and cluster.task("lm")["step"] >= 10, 300, "a hot spare"
        )
        rows = [json.loads(line) for line in trace.read_text().splitlines()]
        cluster.wait(
            lambda: any(
                json.loads(line)["what"] == "spare_waiting" for line in trace.read_text().splitlines()
            ),
            120,
            "the spare to be loaded and waiting",
        )
        cluster.kill_worker("lm", 1)
        cluster.wait(lambda: cluster.task("lm")["state"] == "finished", 300, "the task to finish")
        events = cluster.get("/v1/events", task="lm")
    names = [e["kind"] for e in events]
    assert names.count("task_launch") == 1, names
    assert "in_process_recovery" in names
    grows = [e["detail"] for e in events if e["kind"] == "task_grow"]
    assert grows and grows[0]["spares_used"] and grows[0]["placement"] == {}, grows
    assert "task_grown" in names
    assert names.count("spare_launched") >= 2  # the freed slot got a new spare
    rows = [json.loads(line) for line in trace.read_text().splitlines()]
    assert any(r["what"] == "spare_used" for r in rows)
    steps: dict[int, list[int]] = {}
    for r in rows:
        if r["what"] == "samples":
            steps.setdefault(r["step"], []).extend(r["ids"])
    for step in range(1, ITERATIONS + 1):
        assert Counter(steps.get(step, [])) == Counter(global_batch_ids(step, 16, 512, 0)), step
    final = load_latest(tmp_path / "cluster" / "checkpoints" / "lm")
    assert final is not None and final["step"] == ITERATIONS
    assert_same_parameters(final["model"], reference(tmp_path, ITERATIONS))

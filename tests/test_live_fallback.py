"""The last fallback tier through real processes: a restart from the newest *intact* checkpoint.

A task that restarts on failure (``recovery: restart``) has its newest checkpoint damaged in
both tiers (the persistent folder and the node's in-memory copy) just before a worker fails.
The restart must pass over the damaged copies, say so in an event naming them, resume from the
next newest intact one, and still end with the parameters of a failure-free run: every step
after the restart retrains exactly its global batch.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from unicron.control.launch.localcluster import LocalCluster

from .test_live_cluster import (
    assert_ends_exact,
    assert_ledger_exact,
    latest_generation,
    read_trace,
    traced_task,
)

ITERATIONS = 40


@pytest.mark.timeout(420)
def test_a_restart_passes_over_a_damaged_newest_checkpoint(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    spec = traced_task(
        trace,
        "{2: 2.0e9}",
        ITERATIONS,
        0.05,
        "  recovery: restart\n"
        "  faults:\n"
        "    - {action: corrupt_checkpoint, rank: 0, step: 25}\n"
        "    - {action: raise, rank: 0, step: 25, message: the loss went NaN}\n",
    )
    with LocalCluster(tmp_path / "cluster", nodes=1, slots=2) as cluster:
        cluster.submit(spec)
        cluster.wait(lambda: cluster.task("lm")["state"] == "finished", 300, "the task to finish")
        events = cluster.get("/v1/events", task="lm")
    kinds = [e["kind"] for e in events]
    assert kinds.count("task_launch") == 2, kinds  # the first launch and one restart
    damaged = [e["detail"] for e in events if e["kind"] == "checkpoint_corrupt"]
    assert damaged, kinds
    for report in damaged:
        # Step 20 was damaged in both tiers; the restart used step 10.
        assert sorted(Path(s["path"]).name for s in report["skipped"]) == ["step-00000020.pt"] * 2
        assert all(s["why"].startswith("unreadable") for s in report["skipped"])
        assert Path(report["used"]).name == "step-00000010.pt" and report["step"] == 10
    restored = [
        e["detail"] for e in events if e["kind"] == "checkpoint_restored" and e["detail"]["rank"] == 0
    ]
    assert [r["step"] for r in restored] == [10] and restored[0]["generation"] > 1
    rows = read_trace(trace)
    assert {r["step"] for r in rows if r["what"] == "resumed"} == {10}
    assert_ledger_exact(latest_generation(rows), ITERATIONS)
    assert_ends_exact(tmp_path, "lm", ITERATIONS)

"""A planned stop whose ranks take it at different step boundaries, through real processes.

The plan stops a task by SIGTERM to each rank, and each rank stops at the first step boundary
after its own signal: one that took it a boundary later than its peer is inside the next step,
in a reduction its stopped peer will never join. It must abandon that step, not wait to rejoin a
group (it would be killed there, and the task's stop checkpoint, which rank 0 writes, would be
lost with the steps since the last periodic one), and stop at the last step it completed. The
task that takes the slots starts there only once the stopped task's processes have exited.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from unicron.control.launch.localcluster import LocalCluster
from unicron.core.workerenv import host_checkpoint_dir
from unicron.train.checkpoint import load_latest

from .test_live_cluster import (
    ARGS,
    TRAIN,
    assert_ends_exact,
    assert_ledger_exact,
    full_speed,
    pace,
    read_trace,
    traced_task,
)

ITERATIONS = 40


# Under fp16 the loop's registered GradScaler runs in the abandoned step too: it must see
# gradients, change nothing and keep its scale (train/noupdate.py), as
# tests/test_noupdate.py::test_the_code_after_the_micro_batches_changes_nothing_and_the_optimizer_steps_again
# shows on the same code path.
@pytest.mark.timeout(420)
def test_a_rank_that_takes_a_planned_stop_a_step_late_abandons_that_step_and_saves_the_last(
    tmp_path: Path,
) -> None:
    trace = tmp_path / "trace.jsonl"
    # Rank 0 (the one that writes the persistent checkpoint) takes its stop 2 s late: rank 1 has
    # stopped by then, and rank 0 is in the next step's all-reduce or waiting to rejoin.
    late = "  faults: [{action: late_stop, rank: 0, step: 1, generation: 1, seconds: 2}]\n"
    low = traced_task(trace, "{2: 2.0e9}", ITERATIONS, 0.1, late, name="low")
    program = ", ".join(["python", str(TRAIN), *ARGS, "--step-delay", "0.05"])
    high = f"name: high\nweight: 5\nthroughput: {{2: 6.0e9}}\nrun:\n  program: [{program}]\n"
    high += "  iterations: 10\n"
    # Stops get 10 s before SIGKILL: the late rank must stop on its own, not be killed.
    settings = {"stop_grace_s": 10.0, "restart_stop_wait_s": 12.0}
    with LocalCluster(tmp_path / "cluster", nodes=2, slots=1, settings=settings) as cluster:
        cluster.submit(low)
        cluster.wait(lambda: cluster.task("low")["step"] >= 13, 300, "low to train past a checkpoint")
        # Slower steps (still shorter than rank 0's 2 s delay) until low is stopped: on a loaded
        # machine the plan's stop could come after the steps left at full pace.
        pace(trace, 0.5)
        cluster.submit(high)  # it takes both slots: low is stopped, and relaunched when high ends
        cluster.wait(lambda: cluster.task("low")["state"] == "waiting", 60, "low to be stopped")
        full_speed(trace)
        # Each rank saved the stop checkpoint in its node's memory: rank 1 at the boundary where it
        # stopped, rank 0 after abandoning the step after it. The same step, the same state (the
        # model, the optimizer, the scheduler).
        persistent = tmp_path / "cluster" / "checkpoints" / "low"
        saved = [load_latest(host_checkpoint_dir(persistent, node)) for node in ("node-0", "node-1")]

        def finished() -> bool:
            return all(cluster.task(n)["state"] == "finished" for n in ("low", "high"))

        cluster.wait(finished, 300, "both to finish")
        every = cluster.get("/v1/events")
    errors = [e["detail"] for e in every if e["kind"] == "coordinator_error"]
    assert not errors, errors  # (a plan answering high's end named it after it was gone)
    events = [e for e in every if e["task"] == "low"]
    launches = [e["detail"] for e in events if e["kind"] == "task_launch"]
    assert [launch["generation"] for launch in launches] == [1, 2], launches
    rows = read_trace(trace)
    done_before_stop = max(r["step"] for r in rows if r["what"] == "samples" and r["generation"] == 1)
    # The relaunch resumed from the step both ranks completed: the stop checkpoint was written.
    assert launches[1]["resume_from"] == done_before_stop, (launches, done_before_stop)
    # Rank 0 was inside the step after it, and abandoned it rather than wait to be killed.
    abandoned = [(r["rank"], r["step"]) for r in rows if r["what"] == "abandoned"]
    assert abandoned == [(0, done_before_stop + 1)], abandoned
    at_zero, at_one = saved
    assert at_zero is not None and at_one is not None
    assert at_zero["step"] == at_one["step"] == done_before_stop
    assert at_zero["state_digest"] == at_one["state_digest"]
    # high started on the nodes' devices only once low's processes had left them (beside them
    # it would have been given device 1 on each node, that is GPU 0 again).
    with sqlite3.connect(tmp_path / "cluster" / "coordinator" / "unicron.sqlite") as db:
        rows_of_workers = db.execute("SELECT task, generation, rank, local_rank FROM workers")
        devices = {(t, g, r): d for t, g, r, d in rows_of_workers}
    assert set(devices.values()) == {0}, devices
    assert_ledger_exact(rows, ITERATIONS, world=2)  # every step once: none lost, none trained twice
    assert_ends_exact(tmp_path, "low", ITERATIONS)

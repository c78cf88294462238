"""Workers that do not exit after their task's last step, through the real stack
(``control/detect/tail.py``). Hang detection stands aside past the last step (there is no next step to
be late), so such a task stayed running, its slots taken, for ever; now its exits are due within
``hang_cap_s`` (here 10 s) of the last step, and what was saved decides what happens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from unicron.control.launch.localcluster import LocalCluster

from .test_live_cluster import assert_ends_exact, traced_task

SETTINGS = {"hang_cap_s": 10.0, "checkpoint_allowance_s": 3.0, "hot_spares": 0}
ITERATIONS = 20


def _run(tmp_path: Path, faults: str) -> list[dict[str, Any]]:
    """Run the task with ``faults`` to its end; its events, once the stacks dumped are in."""
    spec = traced_task(tmp_path / "t.jsonl", "{2: 1.9e9}", ITERATIONS, 0.05, f"  faults: [{faults}]\n")
    with LocalCluster(tmp_path / "cluster", nodes=1, slots=2, settings=SETTINGS) as cluster:
        cluster.submit(spec)
        cluster.wait(lambda: cluster.task("lm")["state"] == "finished", 240, "the task to finish")

        def events() -> list[dict[str, Any]]:
            return list(cluster.get("/v1/events", limit=100_000))

        cluster.wait(lambda: any(e["kind"] == "stacks" for e in events()), 60, "the stacks dumped")
        return events()


@pytest.mark.timeout(420)
def test_a_rank_hung_in_the_final_save_is_killed_and_the_task_relaunched_from_its_checkpoint(
    tmp_path: Path,
) -> None:
    """Rank 0 hangs inside the last step's save, before it reports the final state: nothing was
    saved, so the hung worker is killed and the task trains its last steps again from its
    checkpoint, ending with a failure-free run's parameters."""
    held = f"{{action: slow_save, rank: 0, step: {ITERATIONS}, generation: 0, seconds: 900}}"
    events = _run(tmp_path, held)
    (late,) = [e["detail"] for e in events if e["kind"] == "exit_overdue"]
    assert 0 in late["ranks"] and not late["final_saved"]
    stacks = [e["detail"] for e in events if e["kind"] == "stacks"]
    assert any("saving" in (where or "") for d in stacks for where in d["where"].values()), stacks
    launches = [e["detail"] for e in events if e["kind"] == "task_launch"]
    assert len(launches) == 2 and launches[1]["resume_from"] < ITERATIONS  # from the checkpoint
    assert_ends_exact(tmp_path, "lm", ITERATIONS)


@pytest.mark.timeout(420)
def test_ranks_hung_on_their_way_out_after_the_final_state_was_saved_end_a_finished_task(
    tmp_path: Path,
) -> None:
    """Both ranks save and report the final state, then hang on their way out: the task is
    finished (launched once, no incident) and the hung workers are stopped."""
    hang = "{{action: hang_at_exit, rank: {}, step: 1, generation: 0, seconds: 900}}"
    events = _run(tmp_path, f"{hang.format(0)}, {hang.format(1)}")
    (late,) = [e["detail"] for e in events if e["kind"] == "exit_overdue"]
    assert late["ranks"] == [0, 1] and late["final_saved"]
    stacks = [e["detail"] for e in events if e["kind"] == "stacks"]
    assert any("exiting" in (where or "") for d in stacks for where in d["where"].values()), stacks
    kinds = [e["kind"] for e in events]
    assert kinds.count("task_launch") == 1 and "incident" not in kinds
    assert_ends_exact(tmp_path, "lm", ITERATIONS)

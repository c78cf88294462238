"""Workers that do not exit after their task's last step, through the real stack
(``control/detect/tail.py``). Hang detection stands aside past the last step (there is no next step to
be late), so such a task stayed running, its slots taken, for ever; now its exits are due within
``hang_cap_s`` (here 4 s) of the last step, and what was saved decides what happens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from unicron.control.launch.localcluster import LocalCluster

from .test_live_cluster import assert_ends_exact, finish_and_settle, story_of, traced_task

# hang_cap_s above the heartbeat deadline (2.5 s) and the hang floor (1.5 s): a worker is not
# overdue before its node could be known lost.
SETTINGS = {"hang_cap_s": 4.0, "checkpoint_allowance_s": 3.0, "hot_spares": 0}
ITERATIONS = 20


@pytest.mark.timeout(420)
def test_ranks_hung_after_the_last_step_are_handled_by_what_was_saved(tmp_path: Path) -> None:
    """Two tasks on one cluster, at once (merged from two tests of one task each; each task's
    checks are those of its test, on its own events).

    ``held`` (was test_a_rank_hung_in_the_final_save_is_killed_and_the_task_relaunched_from_its_checkpoint):
    rank 0 hangs inside the last step's save, before it reports the final state: nothing was
    saved, so the hung worker is killed and the task trains its last steps again from its
    checkpoint, ending with a failure-free run's parameters.

    ``out`` (was test_ranks_hung_on_their_way_out_after_the_final_state_was_saved_end_a_finished_task):
    both ranks save and report the final state, then hang on their way out: the task is
    finished (launched once, no incident) and the hung workers are stopped."""
    held = f"[{{action: slow_save, rank: 0, step: {ITERATIONS}, generation: 0, seconds: 900}}]"
    hang = "{{action: hang_at_exit, rank: {}, step: 1, generation: 0, seconds: 900}}"
    out = f"[{hang.format(0)}, {hang.format(1)}]"
    specs = [
        traced_task(tmp_path / f"{name}.jsonl", "{2: 1.9e9}", ITERATIONS, 0.05, f"  faults: {faults}\n", name)
        for name, faults in (("held", held), ("out", out))
    ]
    both = "".join("  - " + s.replace("\n", "\n    ").rstrip() + "\n" for s in specs)
    with LocalCluster(tmp_path / "cluster", nodes=2, slots=2, settings=SETTINGS) as cluster:
        cluster.submit(f"tasks:\n{both}")  # one request: both planned together, 2 workers each

        def events(task: str) -> list[dict[str, Any]]:
            return list(cluster.get("/v1/events", task=task, limit=100_000))

        for task in ("held", "out"):
            # Finished, and every process it started has exited (the hung ones were stopped).
            finish_and_settle(cluster, tmp_path / f"{task}.jsonl", task)
            cluster.wait(lambda t=task: any(e["kind"] == "stacks" for e in events(t)), 60, f"{task}'s stacks")
        held_events, out_events = events("held"), events("out")
    assert_held_relaunched(held_events)
    assert_ends_exact(tmp_path, "held", ITERATIONS)
    assert_out_finished(out_events)
    assert_ends_exact(tmp_path, "out", ITERATIONS)


def assert_held_relaunched(events: list[dict[str, Any]]) -> None:
    story = story_of(events)
    # The hung save's generation is overdue with nothing saved. The relaunch may be overdue too
    # once it saved the final state: a worker's exit after its last step took up to 11 s on a
    # loaded machine, past hang_cap_s (4 s here), and such a worker is stopped, the task finished.
    late, *relaunch = [e["detail"] for e in events if e["kind"] == "exit_overdue"]
    assert 0 in late["ranks"] and not late["final_saved"], story
    assert all(r["final_saved"] and r["generation"] > late["generation"] for r in relaunch), story
    stacks = [e["detail"] for e in events if e["kind"] == "stacks"]
    assert any("saving" in (where or "") for d in stacks for where in d["where"].values()), stacks
    launches = [e["detail"] for e in events if e["kind"] == "task_launch"]
    assert len(launches) == 2 and launches[1]["resume_from"] < ITERATIONS, story  # from the checkpoint


def assert_out_finished(events: list[dict[str, Any]]) -> None:
    story = story_of(events)
    (late,) = [e["detail"] for e in events if e["kind"] == "exit_overdue"]
    assert late["ranks"] == [0, 1] and late["final_saved"], story
    stacks = [e["detail"] for e in events if e["kind"] == "stacks"]
    assert any("exiting" in (where or "") for d in stacks for where in d["where"].values()), stacks
    kinds = [e["kind"] for e in events]
    assert kinds.count("task_launch") == 1 and "incident" not in kinds, story

"""A task's downtime, one definition everywhere: from when the failure began (its injection, else
its first sign: an exit's time, a hang's last completed step, a lost node's last heartbeat),
detection included, until the first step completed after the recovery; a failed task's stops at
its failure. The coordinator stepped by hand (``tests/fakecluster.py``)."""

from __future__ import annotations

from typing import Any

from unicron.control.service import dashboard
from unicron.control.service.service import task_summary
from unicron.core.states import TaskState


def test_a_hangs_downtime_counts_from_the_last_completed_step(make: Any) -> None:
    """A step that never ends stalls training long before the hang is detected: all of it is
    downtime (it was reported from the detection: 0.5 s for a 32 s stall)."""
    cluster = make(hang_multiple=3.0)
    for step in range(2, 22):
        cluster.train(step)
        cluster.step(0.5)
    stalled_from = cluster.clock.now - 0.5  # step 21's report is its end
    for _ in range(200):
        if cluster.events("hang_detected"):
            break
        cluster.step(0.5)
    (hang,) = cluster.events("hang_detected")
    for _ in range(100):  # no rank to blame: relaunched from the checkpoint (step 0)
        if cluster.c.store.get_task("lm").launched_generation > 1:
            break
        cluster.step(0.5)
    cluster.step(0.5)
    cluster.train(1)
    (outcome,) = cluster.events("outcome")
    assert outcome["outcome"] == "recovered"
    assert outcome["downtime_s"] >= cluster.clock.now - stalled_from - 0.5 > hang["waited_s"] / 2
    assert cluster.c.store.get_task("lm").downtime(cluster.clock.now) == outcome["downtime_s"]


def test_a_crashs_downtime_counts_from_the_exit_not_its_report(make: Any) -> None:
    cluster = make()
    died = cluster.clock.now - 4.0  # reported 4 s late (a slow heartbeat)
    cluster.exit(3, at=died)
    cluster.step(0.5)
    cluster.train(2)
    (outcome,) = cluster.events("outcome")
    assert outcome["downtime_s"] == round(cluster.clock.now - died, 3)


def test_a_failed_tasks_downtime_stops_at_its_failure_and_reads_the_same_everywhere(make: Any) -> None:
    cluster = make(recovery="restart", same_fault_limit=1)
    cluster.exit(1, code=0)  # left before the last step: the task's fault, at the limit of one
    task = cluster.c.store.get_task("lm")
    assert task.state is TaskState.FAILED
    at_failure = task.downtime(cluster.clock.now)
    cluster.step(100.0)
    summary = task_summary(cluster.c, cluster.c.store.get_task("lm"))
    (shown,) = dashboard.document(cluster.c.viewer.view(), [], [], [])["tasks"]
    assert summary["downtime_s"] == shown["downtime_s"] == round(at_failure, 3)

"""A task's name once its task has ended, stepped by hand (``tests/fakecluster.py``): submitted
again it runs a new task, the ended one kept as NAME#RUN; a live task keeps its name, and the
refusal says what to do; cancelling an ended task changes nothing and says so. Reports of the
ended task's processes never count for the new one."""

from __future__ import annotations

from typing import Any

import pytest

from unicron.cli.live import worker_output
from unicron.control.service.service import recent_incidents, task_summary
from unicron.core.errors import Conflict
from unicron.core.livespecs import parse_live_tasks
from unicron.core.protocol import DoneReport, ExitReport, ForgetTask, LaunchWorker
from unicron.core.states import TaskState
from unicron.core.workerenv import WorkerEnv

from .fakecluster import SPEC, Cluster

AGAIN = SPEC.format(recovery="in_process", run_extra=", faults: [{action: kill, rank: 1, step: 50}]")


def stopped(cluster: Cluster, task: str = "lm") -> None:
    """The agents report the exits of the task's processes their stop orders ended."""
    for (t, g, r), (node, _) in sorted(cluster.running.items()):
        if t == task:
            cluster.running.pop((t, g, r), None)
            ended = ExitReport(task=t, generation=g, rank=r, node=node, code=None, signal=15)
            cluster.beat(node, ended.model_copy(update={"stop_ordered": True}))


def launches(cluster: Cluster, generation: int) -> list[LaunchWorker]:
    return [o for _, o in cluster.orders if isinstance(o, LaunchWorker) and o.generation == generation]


def test_an_ended_tasks_name_runs_anew_and_the_ended_one_is_kept(make: Any) -> None:
    cluster = make()
    cluster.train(2)
    with pytest.raises(Conflict, match=r"'lm' is running: cancel it first \(`unicron cancel lm`\)"):
        cluster.c.submit(*parse_live_tasks(AGAIN, "again"))
    assert cluster.c.cancel("lm") is True
    assert cluster.c.cancel("lm") is False  # ended already: nothing more to do, no error
    # Its processes are still exiting (SIGTERM, then SIGKILL): they hold their slots, and their
    # exits must reach their own task.
    with pytest.raises(Conflict, match="4 of its processes are still exiting"):
        cluster.c.submit(*parse_live_tasks(AGAIN, "again"))
    stopped(cluster)
    before = max(w.generation for w in cluster.c.store.workers("lm"))
    cluster.c.submit(*parse_live_tasks(AGAIN, "again"))

    kept, new = cluster.c.store.get_task("lm#1"), cluster.c.store.get_task("lm")
    assert (kept.state, kept.step, kept.run) == (TaskState.CANCELLED, 2, 1)
    assert (new.state, new.step, new.run, new.first_generation) == (TaskState.WAITING, 0, 2, before + 1)
    (replaced,) = cluster.events("task_replaced")
    assert (replaced["kept_as"], replaced["state"], replaced["step"], replaced["run"]) == (
        "lm#1",
        "cancelled",
        2,
        2,
    )
    assert task_summary(cluster.c, kept)["state"] == "cancelled"  # readable, with its own spec
    assert cluster.c.spec("lm").run.faults and not cluster.c.spec("lm#1").run.faults

    # The new run is planned and launched afresh: its generations follow the earlier run's, it
    # checkpoints to a folder of its own, and its faults count generations from its first.
    cluster.c.placer.allocator.wait()
    cluster.step()
    cluster.step()
    new = cluster.c.store.get_task("lm")
    assert new.generation == before + 1 and len(launches(cluster, before + 1)) == 4
    env = WorkerEnv.from_env(launches(cluster, before + 1)[0].env)
    assert env is not None and env.checkpoint_dir == str(cluster.settings.checkpoint_root / "lm#2")
    assert env.faults is not None and env.faults[0]["generation"] == before + 1
    cluster.train(1)
    new = cluster.c.store.get_task("lm")
    assert (new.state, new.step, new.samples, new.restarts) == (TaskState.RUNNING, 1, 16, 0)

    # A late report of the ended task's processes (an agent back from a partition): refused.
    late = DoneReport(task="lm", generation=1, rank=0, step=100, digest="old")
    cluster.beat("n0", late)
    assert cluster.c.store.get_task("lm").digest is None
    (rejected,) = [e for e in cluster.events("report_rejected") if e["report"] == "done"]
    assert "earlier task of that name" in rejected["why"]

    # Both are there after a restart; the ended one's in-memory copies are its own folder's.
    cluster.restart()
    assert cluster.c.store.get_task("lm#1").state is TaskState.CANCELLED
    assert cluster.c.store.get_task("lm").run == 2
    cluster.c.ctx.forget_task("lm#1")
    forget = [o for _, o in cluster.orders if isinstance(o, ForgetTask)]
    assert forget[0].checkpoint_dir == str(cluster.settings.checkpoint_root / "lm")


def test_a_worker_that_ended_before_its_first_step_tells_its_output(make: Any) -> None:
    """The agent sends the output's end of a worker that ended before completing a step: the
    incident, its event and `unicron status` say how it ended, where its output is and its
    last lines."""
    cluster = make()
    cluster.c.cancel("lm")
    stopped(cluster)
    cluster.c.submit(*parse_live_tasks(SPEC.format(recovery="in_process", run_extra=""), "again"))
    cluster.c.placer.allocator.wait()
    cluster.step()
    task = cluster.c.store.get_task("lm")
    node, _ = cluster.running.pop(("lm", task.generation, 0))
    tail = "Traceback (most recent call last):\nFileNotFoundError: data/train.bin"
    log = "/agents/n0/logs/lm-g2-r0.log"
    exit_ = ExitReport(
        task="lm", generation=task.generation, rank=0, node=node, code=2, signal=None, log=log, log_tail=tail
    )
    cluster.beat(node, exit_)
    (incident,) = [e for e in cluster.events("incident") if e["generation"] == task.generation]
    assert (incident["log"], incident["log_tail"]) == (log, tail)
    assert (
        incident["why"]
        == f"rank 0 on {node} exited with code 2; it completed no step (its output: {node}:{log})"
    )
    (latest,) = [b.as_dict() for b in recent_incidents(cluster.c, "lm", 1)]
    assert (latest["log"], latest["log_tail"]) == (log, tail)
    tasks = [task_summary(cluster.c, t) for t in cluster.c.store.tasks()]
    shown = [t.plain for t in worker_output([latest], tasks)]
    assert shown[0].startswith(f"lm, incident {latest['incident']}: rank 0 on {node} exited with code 2")
    assert shown[1] == "  | Traceback (most recent call last):\n  | FileNotFoundError: data/train.bin"
    # An exit without it (a worker that trained, or was stopped) shows nothing of the kind, nor
    # does an incident of an earlier task of the name.
    assert worker_output([{**latest, "log": None, "log_tail": None}], tasks) == []
    cluster.c.cancel("lm")
    stopped(cluster)
    cluster.clock.now += 1.0
    cluster.c.submit(*parse_live_tasks(SPEC.format(recovery="in_process", run_extra=""), "again"))
    tasks = [task_summary(cluster.c, t) for t in cluster.c.store.tasks()]
    assert worker_output([latest], tasks) == []

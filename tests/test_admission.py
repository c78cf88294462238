"""Which node may report about which worker (``control/recover/admission.py``): the pure refusal on
hand-built rows, then the forgery probe's attack through the coordinator stepped by hand: a node
that does not host a task's workers reports them done, exited or failed, and nothing changes."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

from unicron.brain.records import WorkerRecord
from unicron.control.recover.admission import refusal
from unicron.core.protocol import (
    SPARE_GENERATION,
    CheckpointReport,
    DoneReport,
    ExceptionReport,
    ExitReport,
    IterationReport,
    LaunchFailedReport,
    Registration,
    StacksReport,
    StopWorkers,
    StorageReport,
)
from unicron.core.states import TaskState, WorkerPhase


def row(generation: int, rank: int, node: str, state: WorkerPhase = WorkerPhase.RUNNING) -> WorkerRecord:
    return WorkerRecord("lm", generation, rank, node, rank % 2, state, 100 + rank, None, None, 0.0)


class Rows:
    """The two reads ``refusal`` makes, over hand-built rows."""

    def __init__(self, *rows: WorkerRecord) -> None:
        self.rows = {r.key: r for r in rows}
        self.tasks: dict[str, Any] = {}

    def worker(self, task: str, generation: int, rank: int) -> WorkerRecord | None:
        return self.rows.get((task, generation, rank))

    def workers(self, task: str, generation: int | None = None, live: bool = False) -> list[WorkerRecord]:
        return [r for r in self.rows.values() if r.task == task and generation in (None, r.generation)]

    def task(self, name: str) -> Any:
        return self.tasks.get(name)  # (none, but in the earlier-run test)


STORE: Any = Rows(
    row(1, 0, "n0", WorkerPhase.MOVED),  # renamed in place into generation 2
    row(1, 1, "n1", WorkerPhase.FAILED),
    row(2, 0, "n0"),
    row(2, 1, "n1"),
    row(3, 2, "n1", WorkerPhase.LAUNCHING),  # a newcomer of a grow into generation 3
    row(SPARE_GENERATION, 1000, "n2", WorkerPhase.SPARE),
)


def exit_(generation: int, rank: int, node: str, code: int | None = 0) -> ExitReport:
    return ExitReport(task="lm", generation=generation, rank=rank, node=node, code=code, signal=None)


def test_a_worker_report_is_taken_only_from_the_node_of_its_row() -> None:
    done = DoneReport(task="lm", generation=2, rank=0, step=100, digest="d")
    assert refusal(done, "n0", STORE) is None
    why = refusal(done, "n1", STORE)
    assert why is not None and "runs on node 'n0', not on node 'n1'" in why
    step = IterationReport(task="lm", generation=2, rank=1, step=5, duration_s=0.1, samples=4)
    assert refusal(step, "n1", STORE) is None and refusal(step, "n0", STORE) is not None
    raised = ExceptionReport(task="lm", generation=2, rank=1, step=5, error_type="E", message="m")
    assert refusal(raised, "n1", STORE) is None and refusal(raised, "n2", STORE) is not None
    saved = CheckpointReport(task="lm", generation=2, rank=0, step=5, path="p")
    assert refusal(saved, "n0", STORE) is None and refusal(saved, "n1", STORE) is not None
    # Storage reports come from the rank whose save failed: held to its node like the rest.
    full = StorageReport(task="lm", generation=2, rank=0, step=5, tier="host_memory", ok=False)
    assert refusal(full, "n0", STORE) is None and refusal(full, "n1", STORE) is not None


def test_no_row_no_report() -> None:
    for report in (
        DoneReport(task="lm", generation=2, rank=3, step=100, digest="d"),  # no such rank
        DoneReport(task="lm", generation=9, rank=0, step=100, digest="d"),  # no such generation
        DoneReport(task="other", generation=2, rank=0, step=100, digest="d"),  # no such task
        exit_(SPARE_GENERATION, 1001, "n2"),  # no such spare
    ):
        why = refusal(report, "n0" if report.generation else "n2", STORE)
        assert why is not None and "no worker is known" in why, report


def test_an_agents_own_reports_must_name_the_sender() -> None:
    # The row is on the sender, but the report speaks for another node: a forgery all the same.
    why = refusal(exit_(2, 0, "n1"), "n0", STORE)
    assert why is not None and "speaks for node 'n1'" in why
    assert refusal(exit_(2, 0, "n0"), "n0", STORE) is None
    assert refusal(exit_(2, 0, "n0"), "n1", STORE) is not None  # names its true node, sent by another
    failed = LaunchFailedReport(task="lm", generation=3, rank=2, node="n1", error="e")
    assert refusal(failed, "n1", STORE) is None
    assert refusal(failed.model_copy(update={"node": "n0"}), "n0", STORE) is not None


def test_spares_newcomers_moved_and_stale_rows_are_reported_by_their_nodes() -> None:
    assert refusal(exit_(SPARE_GENERATION, 1000, "n2"), "n2", STORE) is None
    assert refusal(exit_(SPARE_GENERATION, 1000, "n0"), "n0", STORE) is not None
    assert refusal(exit_(3, 2, "n1", code=1), "n1", STORE) is None  # a newcomer, not yet joined
    assert refusal(exit_(3, 2, "n0", code=1), "n0", STORE) is not None
    # A survivor renamed in place reports its exit under the identity it has not left yet.
    assert refusal(exit_(1, 0, "n0", code=1), "n0", STORE) is None
    assert refusal(exit_(1, 0, "n1", code=1), "n1", STORE) is not None
    # A report of a generation that is gone is admitted (the coordinator then ignores it).
    assert refusal(exit_(1, 1, "n1", code=1), "n1", STORE) is None


def test_a_row_of_an_earlier_task_of_the_name_reports_nothing() -> None:
    """The name's task ended and was submitted again: a late report of the ended one's processes
    (an agent back from a partition) names a row launched before the new task was submitted."""
    store = Rows(row(2, 0, "n0"), replace(row(4, 0, "n0"), launched=50.0))
    store.tasks = {"lm": SimpleNamespace(submitted=10.0)}  # the new task, submitted at 10
    why = refusal(DoneReport(task="lm", generation=2, rank=0, step=100, digest="d"), "n0", store)
    assert why is not None and "earlier task of that name" in why
    assert refusal(DoneReport(task="lm", generation=4, rank=0, step=100, digest="d"), "n0", store) is None


def test_stacks_come_only_from_a_node_that_hosts_the_generation() -> None:
    stacks = StacksReport(task="lm", generation=1, node="n1", stacks={})
    assert refusal(stacks, "n1", STORE) is None  # its worker died since: still asked of it
    assert refusal(stacks, "n0", STORE) is not None  # speaks for another node
    elsewhere = StacksReport(task="lm", generation=3, node="n0", stacks={})
    why = refusal(elsewhere, "n0", STORE)
    assert why is not None and "hosts no worker" in why


# ------------------------------------------------------------------ through the coordinator


def placed(cluster: Any) -> tuple[int, dict[int, str]]:
    """The task's generation and its ranks' nodes."""
    generation = cluster.c.store.get_task("lm").generation
    return generation, {r: n for (t, g, r), (n, _) in cluster.running.items() if g == generation}


def rejections(cluster: Any) -> list[dict[str, Any]]:
    """The ``report_rejected`` events, with the node and task they were recorded for."""
    found = cluster.c.store.events(kinds=("report_rejected",))
    return [{"node": e.node, "task": e.task, **e.detail} for e in found]


def untouched(cluster: Any, orders_before: int, generation: int, step: int) -> None:
    task = cluster.c.store.get_task("lm")
    assert task.state is TaskState.RUNNING and task.generation == generation
    assert task.step == step and task.digest is None
    assert all(w.state is WorkerPhase.RUNNING for w in cluster.c.store.workers("lm", generation))
    stops = [o for _, o in cluster.orders[orders_before:] if isinstance(o, StopWorkers)]
    assert stops == [] and cluster.events("incident") == [] and cluster.events("task_finished") == []
    assert cluster.c.recovery.ladder.node_errors == {}


@pytest.mark.parametrize("stranger", [True, False])
def test_a_node_cannot_finish_a_task_it_does_not_run(make: Any, stranger: bool) -> None:
    """The probe's attack: rank 0 done at the last step, then a clean exit of a rank hosted
    elsewhere, from a node hosting none of the task (or from the wrong one of its nodes)."""
    cluster = make()
    cluster.train(33)
    generation, nodes = placed(cluster)
    if stranger:
        cluster.c.register(Registration(node="n2", slots=2))
        sender = "n2"
    else:
        sender = next(n for n in ("n0", "n1") if n != nodes[0])
    victim = next(r for r, n in sorted(nodes.items()) if r != 0 and n != sender)
    before = len(cluster.orders)
    cluster.beat(
        sender,
        DoneReport(task="lm", generation=generation, rank=0, step=100, digest="forged"),
        exit_(generation, victim, nodes[victim]),  # names the victim's node
        exit_(generation, victim, sender),  # names its own
    )
    untouched(cluster, before, generation, 33)
    rejected = rejections(cluster)
    assert [(e["report"], e["task"], e["rank"], e["node"]) for e in rejected] == [
        ("done", "lm", 0, sender),
        ("exit", "lm", victim, sender),
        ("exit", "lm", victim, sender),
    ]
    assert f"runs on node {nodes[0]!r}, not on node {sender!r}" in rejected[0]["why"]
    assert f"speaks for node {nodes[victim]!r}" in rejected[1]["why"]
    assert f"runs on node {nodes[victim]!r}" in rejected[2]["why"]
    for _ in range(3):
        cluster.step()
    assert cluster.c.store.get_task("lm").state is TaskState.RUNNING
    # The genuine reports, from the nodes that host their ranks, still finish it.
    cluster.train(100)
    cluster.beat(nodes[0], DoneReport(task="lm", generation=generation, rank=0, step=100, digest="d"))
    cluster.exit(victim, code=0)
    task = cluster.c.store.get_task("lm")
    assert task.state is TaskState.FINISHED and task.digest == "d"


def test_a_forged_failure_kills_nothing_and_blames_no_node(make: Any) -> None:
    cluster = make()
    generation, nodes = placed(cluster)
    victim = 0
    sender = next(n for n in ("n0", "n1") if n != nodes[victim])
    before = len(cluster.orders)
    cluster.beat(
        sender, exit_(generation, victim, nodes[victim], code=1), exit_(generation, victim, sender, code=1)
    )
    raised = ExceptionReport(
        task="lm", generation=generation, rank=victim, step=1, error_type="E", message="m"
    )
    cluster.beat(sender, raised)
    for _ in range(3):
        cluster.step()
    untouched(cluster, before, generation, 1)
    assert [e["report"] for e in rejections(cluster)] == ["exit", "exit", "exception"]
    assert cluster.events("exception") == []
    # The same exit from the victim's own node is a failure, handled as one.
    cluster.exit(victim)
    assert cluster.events("incident")

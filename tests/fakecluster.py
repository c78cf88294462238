"""The coordinator stepped by hand for its logic tests: a fake clock, the agents' side of the
protocol played by the test, no worker processes. The ``make`` fixture (in conftest.py) builds a
coordinator with one task of 4 ranks on two nodes of 2 slots, launched and at step 1; or any
number of nodes (``n0``, ``n1``, ...), slots and tasks (``make(nodes=3, spec=...)``)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from unicron.control.coordinator import Coordinator, CoordinatorSettings
from unicron.core.classify import classify
from unicron.core.livespecs import DEFAULT_LIVE_CLUSTER, LiveClusterSpec, parse_live_cluster, parse_live_tasks
from unicron.core.protocol import (
    SPARE_GENERATION,
    DoneReport,
    ExceptionReport,
    ExitReport,
    Heartbeat,
    IterationReport,
    LaunchWorker,
    Order,
    OrderBatch,
    Phase,
    Progress,
    Registration,
    RenameWorkers,
    StopWorkers,
    WorkerReport,
    WorkerState,
    ready_key,
)
from unicron.core.settings import Settings
from unicron.core.states import NodeState, TaskState

SPEC = """
name: lm
weight: 1
throughput: {{1: 1.0e9, 2: 2.0e9, 3: 2.7e9, 4: 3.6e9}}
run: {{program: [python, train.py], iterations: 100, recovery: {recovery}{run_extra}}}
"""


@dataclass
class Clock:
    now: float = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Cluster:
    """The coordinator and the agents' side of the protocol, played by hand."""

    c: Coordinator
    clock: Clock
    settings: CoordinatorSettings
    nodes: tuple[str, ...] = ("n0", "n1")
    running: dict[tuple[str, int, int], tuple[str, int]] = field(default_factory=dict)  # -> (node, pid)
    orders: list[tuple[str, Order]] = field(default_factory=list)
    acked: dict[str, int] = field(default_factory=dict)
    pids: int = 100
    positions: dict[tuple[str, int, int], Progress] = field(default_factory=dict)  # what workers sent
    late_renames: set[str] = field(default_factory=set)  # nodes whose agents have not renamed yet
    # Nodes whose stopped workers are still exiting (listed by their agents until the test
    # reports their exits); elsewhere a stopped worker is gone at once.
    slow_stops: set[str] = field(default_factory=set)
    # Workers launched from now on start their training sessions at once: each reports a position
    # (joining its group) from its first heartbeat. Otherwise a worker reports none until the
    # test gives it one (``positions``) or it trains.
    sessions_start: bool = False

    def beat(self, node: str, *reports: WorkerReport) -> None:
        workers = [
            WorkerState(
                task=t, generation=g, rank=r, pid=pid, running=True, progress=self.positions.get((t, g, r))
            )
            for (t, g, r), (n, pid) in self.running.items()
            if n == node
        ]
        hb = Heartbeat(
            node=node,
            workers=workers,
            reports=list(reports),
            acked=self.acked.get(node, 0),
            sent=self.clock.now,
        )
        reply = self.c.heartbeat(hb)
        self._follow(node, OrderBatch(orders=reply.orders, numbers=reply.numbers))
        for other in self.nodes:  # the other agents' long polls
            self._follow(other, self.c.orders(other, self.acked.get(other, 0)))

    def _follow(self, node: str, batch: OrderBatch) -> None:
        fresh = [o for o, n in zip(batch.orders, batch.numbers, strict=True) if n > self.acked.get(node, 0)]
        self.acked[node] = max([self.acked.get(node, 0), *batch.numbers])
        for order in fresh:
            self.orders.append((node, order))
            if isinstance(order, LaunchWorker):
                self.pids += 1
                key = (order.task, order.generation, order.rank)
                self.running[key] = (node, self.pids)
                if self.sessions_start:
                    self.start_session(key)
            elif isinstance(order, RenameWorkers) and node not in self.late_renames:
                for rank, new_rank in order.ranks.items():
                    entry = self.running.pop((order.task, order.generation, rank), None)
                    if entry is not None:
                        self.running[(order.task, order.new_generation, new_rank)] = entry
            elif isinstance(order, StopWorkers):
                self._stopped(node, order)

    def start_session(self, key: tuple[str, int, int]) -> None:
        """Worker ``key`` (task, generation, rank) has started its training session: it reports
        joining its group for the step after the checkpoint it resumes from, from the next
        heartbeat on."""
        task, generation, _ = key
        step = self.c.store.get_task(task).checkpoint_step + 1  # type: ignore[union-attr]
        pid = self.running[key][1]
        self.positions[key] = Progress(pid=pid, generation=generation, step=step, phase=Phase.REJOIN)

    def _stopped(self, node: str, order: StopWorkers) -> None:
        """A stop order carried out: a worker's stop ends it at once (unless its node is slow)."""
        if order.rank is not None and node not in self.slow_stops:
            self.running.pop((order.task, order.generation or 0, order.rank), None)

    def step(self, seconds: float = 0.5) -> None:
        """Time passes; every node heartbeats, the coordinator ticks. The planner's work in the
        background (a table built, a plan solved) is done before the tick whatever the machine's
        load, so that what a test sees does not depend on it (under load, a solve once ended
        during a test's later steps, and its plan was decided there instead of where the test
        had looked)."""
        self.c.placer.allocator.wait()
        self.clock.now += seconds
        for node in self.nodes:
            if self.c.store.node(node).state is not NodeState.LOST:  # type: ignore[union-attr]
                self.beat(node)
        self.c.tick()
        for node in self.nodes:
            self._follow(node, self.c.orders(node, self.acked.get(node, 0)))

    def train(self, step: int, task: str = "lm") -> None:
        """Every running worker of ``task``'s current generation reports ``step``."""
        generation = self.c.store.get_task(task).generation
        for (t, g, r), (node, _) in sorted(self.running.items()):
            if t == task and g == generation:
                report = IterationReport(
                    task=t,
                    generation=g,
                    rank=r,
                    step=step,
                    duration_s=0.1,
                    samples=4,
                    time=self.clock.now,
                )
                self.beat(node, report)

    def exit(
        self,
        rank: int,
        code: int | None = 1,
        signal: int | None = None,
        at: float | None = None,
        *,
        task: str = "lm",
        error: str | None = None,
    ) -> None:
        """Rank ``rank`` of ``task``'s current generation ends; with ``error``, it first reports
        the exception it raised (``RuntimeError(error)``, classified as the worker classifies it)."""
        record = self.c.store.get_task(task)
        node, _ = self.running.pop((task, record.generation, rank))
        reports: list[WorkerReport] = []
        if error is not None:
            kind = classify("RuntimeError", error).value
            reports.append(
                ExceptionReport(
                    task=task,
                    generation=record.generation,
                    rank=rank,
                    step=record.step + 1,
                    error_type="RuntimeError",
                    message=error,
                    kind=kind,
                    time=at if at is not None else self.clock.now,
                )
            )
        report = ExitReport(
            task=task,
            generation=record.generation,
            rank=rank,
            node=node,
            code=code,
            signal=signal,
            time=at if at is not None else self.clock.now,
        )
        self.beat(node, *reports, report)

    def finish(self, task: str = "lm") -> None:
        """``task``'s workers reach its last step, report the final state saved and exit 0."""
        record = self.c.store.get_task(task)
        last = self.c.spec(task).run.iterations
        if record.step < last:
            self.train(last, task)
        ranks = sorted(
            (r, n) for (t, g, r), (n, _) in self.running.items() if (t, g) == (task, record.generation)
        )
        for rank, node in ranks:
            self.beat(
                node, DoneReport(task=task, generation=record.generation, rank=rank, step=last, digest="d")
            )
        for rank, _ in ranks:
            if (task, record.generation, rank) in self.running:  # (not stopped meanwhile)
                self.exit(rank, code=0, task=task)

    def launched(self, task: str = "lm") -> list[tuple[str, LaunchWorker]]:
        """The launch orders of ``task``'s workers (hot spares aside), with their nodes."""
        return [
            (n, o)
            for n, o in self.orders
            if isinstance(o, LaunchWorker) and o.task == task and o.generation != SPARE_GENERATION
        ]

    def grow_under_way(self, step: int) -> Any:
        """Rank 3 dies; the task recovers in place on three, trains ``step``, and the plan starts
        growing it back to four. Returns the growth (its newcomers launched, not ready)."""
        self.exit(3)
        self.train(step)
        for _ in range(3):
            self.step()
        (growth,) = self.c.generations.growing.values()
        return growth

    def regrow(self, step: int) -> Any:
        """:meth:`grow_under_way`, then the newcomers say they are ready and join. Returns the
        growth."""
        growth = self.grow_under_way(step)
        for rank in growth.newcomers:
            self.c.act.rendezvous.set("lm", ready_key("lm", growth.generation, rank), "ready")
        self.step()
        assert self.c.store.get_task("lm").generation == growth.generation  # grown
        return growth

    def restart(self) -> None:
        """The coordinator is killed and started again on the same state (agents and workers
        go on)."""
        self.c.shutdown()
        self.c = Coordinator(self.settings, self.clock)

    def events(self, kind: str) -> list[dict[str, Any]]:
        return [{"id": e.id, **e.detail} for e in self.c.store.events(task=None) if e.kind == kind]


def make_cluster(tmp_path: Path) -> Iterator[Any]:
    made: list[Cluster] = []

    def build(
        recovery: str = "in_process",
        run_extra: str = "",
        *,
        nodes: int = 2,
        slots: int = 2,
        spec: str | None = None,
        cluster: str | LiveClusterSpec | None = None,
        domains: dict[str, str] | None = None,
        probes: bool = False,
        **limits: Any,
    ) -> Cluster:
        """``nodes`` nodes of ``slots`` slots. Without ``spec``: task ``lm`` (4 ranks at most,
        ``recovery`` and ``run_extra`` in its ``run:``) launched and at step 1. With ``spec`` (the
        YAML of one task, or of several under ``tasks:``, submitted in one request): submitted,
        and stepped twice (what was placed is launched; the test trains it). ``cluster``: the
        ``--cluster`` file's text (the planner's hardware). ``domains``: node -> its failure
        domain, as its agent registers it. ``probes``: each agent says it listens for peer
        probes (a no-culprit hang across nodes is then checked: ``control/detect/peercheck.py``)."""
        clock = Clock()
        hardware = parse_live_cluster(cluster) if isinstance(cluster, str) else cluster
        settings = CoordinatorSettings(
            state_dir=tmp_path / f"state{len(made)}",
            checkpoint_root=tmp_path / "ckpt",
            cluster=hardware or DEFAULT_LIVE_CLUSTER,
            limits=Settings(**limits),
        )
        c = Coordinator(settings, clock)
        names = tuple(f"n{i}" for i in range(nodes))
        built = Cluster(c, clock, settings, nodes=names)
        made.append(built)
        for i, node in enumerate(names):
            port = 7000 + i if probes else 0
            c.register(
                Registration(node=node, slots=slots, domain=(domains or {}).get(node), probe_port=port)
            )
        text = SPEC.format(recovery=recovery, run_extra=run_extra) if spec is None else spec
        c.submit(*parse_live_tasks(text, "test"))
        c.placer.allocator.wait()  # the table that answers the submission (built in the background)
        built.step()
        if spec is not None:
            built.step()
            return built
        assert len(built.launched()) == 4
        built.step()
        built.train(1)
        assert c.store.get_task("lm").state is TaskState.RUNNING
        return built

    yield build
    for built in made:
        built.c.shutdown()

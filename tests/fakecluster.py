"""The coordinator stepped by hand for its logic tests: a fake clock, the agents' side of the
protocol played by the test, no worker processes. The ``make`` fixture (in conftest.py) builds a
coordinator with one task of 4 ranks on two nodes of 2 slots, launched and at step 1."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from unicron.control.coordinator import Coordinator, CoordinatorSettings
from unicron.core.livespecs import parse_live_tasks
from unicron.core.protocol import (
    ExitReport,
    Heartbeat,
    IterationReport,
    LaunchWorker,
    Order,
    OrderBatch,
    Progress,
    Registration,
    RenameWorker,
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
    running: dict[tuple[str, int, int], tuple[str, int]] = field(default_factory=dict)  # -> (node, pid)
    orders: list[tuple[str, Order]] = field(default_factory=list)
    acked: dict[str, int] = field(default_factory=dict)
    pids: int = 100
    positions: dict[tuple[str, int, int], Progress] = field(default_factory=dict)  # what workers sent
    late_renames: set[str] = field(default_factory=set)  # nodes whose agents have not renamed yet
    # Nodes whose stopped workers are still exiting (listed by their agents until the test
    # reports their exits); elsewhere a stopped worker is gone at once.
    slow_stops: set[str] = field(default_factory=set)

    def beat(self, node: str, *reports: WorkerReport) -> None:
        workers = [
            WorkerState(
                task=t, generation=g, rank=r, pid=pid, running=True, progress=self.positions.get((t, g, r))
            )
            for (t, g, r), (n, pid) in self.running.items()
            if n == node
        ]
        hb = Heartbeat(node=node, workers=workers, reports=list(reports), acked=self.acked.get(node, 0))
        reply = self.c.heartbeat(hb)
        self._follow(node, OrderBatch(orders=reply.orders, numbers=reply.numbers))
        for other in ("n0", "n1"):  # the other agents' long polls
            self._follow(other, self.c.orders(other, self.acked.get(other, 0)))

    def _follow(self, node: str, batch: OrderBatch) -> None:
        fresh = [o for o, n in zip(batch.orders, batch.numbers, strict=True) if n > self.acked.get(node, 0)]
        self.acked[node] = max([self.acked.get(node, 0), *batch.numbers])
        for order in fresh:
            self.orders.append((node, order))
            if isinstance(order, LaunchWorker):
                self.pids += 1
                self.running[(order.task, order.generation, order.rank)] = (node, self.pids)
            elif isinstance(order, RenameWorker) and node not in self.late_renames:
                entry = self.running.pop((order.task, order.generation, order.rank), None)
                if entry is not None:
                    self.running[(order.task, order.new_generation, order.new_rank)] = entry
            elif isinstance(order, StopWorkers):
                self._stopped(node, order)

    def _stopped(self, node: str, order: StopWorkers) -> None:
        """A stop order carried out: a worker's stop ends it at once (unless its node is slow)."""
        if order.rank is not None and node not in self.slow_stops:
            self.running.pop((order.task, order.generation or 0, order.rank), None)

    def step(self, seconds: float = 0.5) -> None:
        """Time passes; every node heartbeats, the coordinator ticks."""
        self.clock.now += seconds
        for node in ("n0", "n1"):
            if self.c.store.node(node).state is not NodeState.LOST:  # type: ignore[union-attr]
                self.beat(node)
        self.c.tick()
        for node in ("n0", "n1"):
            self._follow(node, self.c.orders(node, self.acked.get(node, 0)))

    def train(self, step: int) -> None:
        """Every running worker of the current generation reports ``step``."""
        task = self.c.store.get_task("lm")
        for (t, g, r), (node, _) in sorted(self.running.items()):
            if t == "lm" and g == task.generation:
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
        self, rank: int, code: int | None = 1, signal: int | None = None, at: float | None = None
    ) -> None:
        task = self.c.store.get_task("lm")
        node, _ = self.running.pop(("lm", task.generation, rank))
        report = ExitReport(
            task="lm",
            generation=task.generation,
            rank=rank,
            node=node,
            code=code,
            signal=signal,
            time=at if at is not None else self.clock.now,
        )
        self.beat(node, report)

    def regrow(self, step: int) -> Any:
        """Rank 3 dies; the task recovers in place on three, trains ``step``, and the plan grows
        it back to four: the newcomers say they are ready and join. Returns the growth."""
        self.exit(3)
        self.train(step)
        for _ in range(3):
            self.step()
        (growth,) = self.c.generations.growing.values()
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

    def build(recovery: str = "in_process", run_extra: str = "", **limits: Any) -> Cluster:
        clock = Clock()
        settings = CoordinatorSettings(
            state_dir=tmp_path / f"state{len(made)}",
            checkpoint_root=tmp_path / "ckpt",
            limits=Settings(**limits),
        )
        c = Coordinator(settings, clock)
        cluster = Cluster(c, clock, settings)
        made.append(cluster)
        for node in ("n0", "n1"):
            c.register(Registration(node=node, slots=2))
        c.submit(*parse_live_tasks(SPEC.format(recovery=recovery, run_extra=run_extra), "test"))
        c.placer.allocator.wait()  # the table that answers the submission (built in the background)
        cluster.step()
        assert len([o for _, o in cluster.orders if isinstance(o, LaunchWorker)]) == 4
        cluster.step()
        cluster.train(1)
        assert c.store.get_task("lm").state is TaskState.RUNNING
        return cluster

    yield build
    for cluster in made:
        cluster.c.shutdown()

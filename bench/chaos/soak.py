"""The soak: three tasks of different weights on a local cluster, successors submitted as they
finish, while the workers inject faults of the library at random steps and the soak strikes the
cluster from outside at random times; then every task must finish, exact, with nothing leaked.

The long soak (``make soak``, ``make bench``) strikes for ``minutes``. The short one
(``short=True``, tests/test_chaos.py) strikes until every kind of outside fault has struck a target
once and waits until every worker fault has struck (``minutes`` is then only its bound), deals
every worker fault to the first tasks (again to a later task where one ended before it struck), keeps nodes
and the coordinator away for 0.5-2.5 s instead of 1-8 s, and finds hangs before the warm-up
sooner (SHORT)."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import leftovers
from bench.chaos import check, inject, report
from bench.chaos.schedule import ITERATIONS, WEIGHTS, WORKER_FAULTS, Plan
from unicron.control.launch.localcluster import LocalCluster

# The soak's cluster: hot spares on, and limits that keep a many-fault run going. An assumption
# of the soak (not a default): isolation is short and repeats do not fail a task, so that the
# run tests recovery under continual faults rather than the ladder's give-up rules. With
# ``--ladder defaults`` the ladder's own settings (LADDER) are left at their defaults, so that
# isolation and escalation are soaked too.
LADDER = {
    "isolation_s": 20,
    "isolate_after": 1000,
    "task_failure_limit": 1000,
    "same_fault_limit": 1000,
    "max_restarts": 1000,
}
SETTINGS = {
    **LADDER,
    "hang_warmup_steps": 3,
    "hang_floor_s": 2.0,
    "first_step_timeout_s": 30.0,  # a rank hung in a launch's first step is found within this
    "hang_cap_s": 30.0,  # and one hung before the warm-up's step times are known
}
# The short soak's: a hang struck before the warm-up's step times are known is found in 10 s. A
# launch's first step, which holds its workers' start (importing torch: four workers on a machine
# whose other core is busy took over 15 s, and every relaunch of the task was cut off there), is
# given 45 s, and so is a worker's start itself: a worker hung while it still imports torch (the
# soak stops a worker the coordinator lists as running) is found by ``start_timeout_s``, 600 s by
# default, which made one short soak last 665 s (make test, 2026-12-06).
SHORT = {"first_step_timeout_s": 45.0, "hang_cap_s": 10.0, "start_timeout_s": 45.0}
SHORT_PAUSE_S = (0.5, 2.5)  # how long the short soak keeps a node or the coordinator away
CHECKPOINT_EVERY, STEP_DELAY = 10, 0.05
ENDED = frozenset({"finished", "failed", "cancelled"})  # the task states that do not change
THROUGHPUT = "{1: 1.0e9, 2: 1.9e9, 4: 3.6e9}"


def task_spec(
    name: str, weight: float, trace: Path, faults: list[dict[str, Any]], model: Sequence[str] = ()
) -> str:
    """``model``: more arguments of the example trainer (the model's size: the tests' smaller one)."""
    argv = ", ".join(["python", str(check.TRAIN), *check.ARGS, *model, "--step-delay", str(STEP_DELAY)])
    return (
        f"name: {name}\nweight: {weight}\nthroughput: {THROUGHPUT}\nrun:\n  program: [{argv}]\n"
        f"  iterations: {ITERATIONS}\n  checkpoint_every: {CHECKPOINT_EVERY}\n  flops_per_sample: 1e7\n"
        f"  env: {{UNICRON_TRACE_FILE: {trace}}}\n  faults: {json.dumps(faults)}\n"
    )


@dataclass
class Soak:
    root: Path
    minutes: float
    seed: int
    mean_gap_s: float = 10.0
    short: bool = False  # strike every kind once, then stop (the module's docstring)
    model: Sequence[str] = ()  # more arguments of every task's trainer (``task_spec``)
    plan: Plan = field(init=False)
    submitted: dict[str, float] = field(default_factory=dict)  # name -> weight
    strikes: list[dict[str, Any]] = field(default_factory=list)
    dealt: dict[str, set[str]] = field(default_factory=dict)  # name -> the worker faults dealt to it
    struck_inside: dict[str, set[str]] = field(default_factory=dict)  # name -> those it struck, as recorded
    events_read: int = 0  # the id of the last of the cluster's events read for them

    def __post_init__(self) -> None:
        if self.short:
            self.plan = Plan(self.seed, ITERATIONS, covering=True, pause_s=SHORT_PAUSE_S)
        else:
            self.plan = Plan(self.seed, ITERATIONS)

    def submit(self, cluster: LocalCluster, weight: float) -> None:
        name = f"w{weight:g}-{sum(w == weight for w in self.submitted.values())}"
        trace = self.root / "traces" / f"{name}.jsonl"
        trace.parent.mkdir(parents=True, exist_ok=True)
        faults = self.plan.worker_faults()
        cluster.submit(task_spec(name, weight, trace, faults, self.model))
        self.submitted[name] = weight
        self.dealt[name] = {f["action"] for f in faults}

    def refill(self, cluster: LocalCluster) -> None:
        """Each weight's task that ended (finished, or failed by the ladder's rules) is followed
        by a new one."""
        tasks = {t["name"]: t for t in cluster.get("/v1/tasks")}
        for weight in WEIGHTS:
            latest = [n for n, w in self.submitted.items() if w == weight][-1]
            if tasks[latest]["state"] in ENDED:
                self.read_struck(cluster)
                self.plan.undelivered(self.dealt[latest] - self.struck_inside.get(latest, set()))
                self.submit(cluster, weight)

    def read_struck(self, cluster: LocalCluster) -> None:
        """The worker faults struck since last read, by task, as the cluster recorded them."""
        for event in cluster.get("/v1/events", since=self.events_read, limit=1_000_000):
            self.events_read = max(self.events_read, event["id"])
            if event["kind"] == "fault_injected":
                self.struck_inside.setdefault(event["task"], set()).add(event["detail"]["action"])

    def every_worker_fault_struck(self, cluster: LocalCluster) -> bool:
        """Whether each kind of worker fault has struck some task (refilling ended tasks first,
        which deals again what they did not strike)."""
        self.refill(cluster)
        self.read_struck(cluster)
        return set().union(*self.struck_inside.values()) >= set(WORKER_FAULTS)

    def run(self, cluster: LocalCluster) -> None:
        for weight in WEIGHTS:
            self.submit(cluster, weight)
        t0 = time.time()
        deadline = t0 + self.minutes * 60
        while time.time() < deadline and not (self.short and self.plan.covered):
            fault = self.plan.next_strike(self.mean_gap_s)
            time.sleep(min(fault.delay_s, max(0.0, deadline - time.time())))
            if time.time() >= deadline:
                break
            self.refill(cluster)
            target = inject.strike(cluster, fault)
            if target is None:
                self.plan.missed(fault.kind)
            self.strikes.append({"at_s": round(time.time() - t0, 1), "kind": fault.kind, "target": target})
        if self.short:  # the worker faults dealt strike as their tasks reach them (the test says if not)
            left_s = max(0.0, deadline - time.time())
            with contextlib.suppress(TimeoutError):
                cluster.wait(lambda: self.every_worker_fault_struck(cluster), left_s, "every worker fault")
        # A task the ladder failed has ended too (the report counts it as not finished): waiting
        # for it to finish waited ten minutes for nothing.
        ended = lambda: all(t["state"] in ENDED for t in cluster.get("/v1/tasks"))  # noqa: E731
        try:
            cluster.wait(ended, 600, "every task to end")
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}\n{stuck(cluster)}") from None


def stuck(cluster: LocalCluster) -> str:
    """What a soak that never ends shows: the nodes (with the live workers on each, by task),
    the cluster's last events, and each unfinished task with its own last events (for the
    failure's message)."""
    nodes = [(n["name"], n["state"], n["used"]) for n in cluster.get("/v1/nodes")]
    lines = [f"nodes: {nodes}", "last events:"]
    recent = cluster.get("/v1/events", limit=1_000_000)[-40:]
    lines += [f"  {e['id']} {e['kind']} {e['task']} {json.dumps(e['detail'])[:300]}" for e in recent]
    for task in cluster.get("/v1/tasks"):
        if task["state"] != "finished":
            lines.append(f"task {task}")
            events = cluster.get("/v1/events", task=task["name"], limit=1_000_000)[-25:]
            lines += [f"  {e['id']} {e['kind']} {json.dumps(e['detail'])[:300]}" for e in events]
    return "\n".join(lines)


def settings_for(ladder: str, short: bool = False) -> dict[str, Any]:
    """The cluster's settings: the soak's (``soak``), or the ladder's defaults (``defaults``);
    ``short``: with the short soak's (SHORT)."""
    chosen = SETTINGS if ladder == "soak" else {k: v for k, v in SETTINGS.items() if k not in LADDER}
    return {**chosen, **SHORT} if short else chosen


def measure(
    root: Path,
    minutes: float,
    seed: int,
    mean_gap_s: float = 10.0,
    ladder: str = "soak",
    short: bool = False,
    reference: Callable[[], dict[str, Any]] | None = None,
    model: Sequence[str] = (),
) -> dict[str, Any]:
    """Run the soak under ``root``; returns the record that docs/bench/chaos.json holds (with
    ``ladder="defaults"``, docs/bench/chaos-defaults.json). ``short``: the short soak (the
    module's docstring), ``minutes`` its bound; ``reference``: the failure-free run of ITERATIONS
    steps that every task must end equal to, where the caller has one (else trained here);
    ``model``: more arguments of every task's trainer, and of that run (``task_spec``). What
    it left behind is counted for this cluster alone (its processes, the ports they or this
    process hold, its in-memory checkpoint folders and files named after its workers), so that it
    may run beside other clusters."""
    settings = settings_for(ladder, short)
    home = root / "cluster"
    ports = leftovers.listening_ports()
    # The failure-free run trains beside the soak, niced: on the CPU the cluster leaves.
    trainer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reference")
    train = reference or (lambda: check.reference(root / "reference", ITERATIONS, model, True))
    wanted = trainer.submit(train)
    soak = Soak(root, minutes, seed, mean_gap_s, short, model)

    def in_memory() -> set[str]:  # the cluster's files in /dev/shm
        folders = check.memory_folders(home / "checkpoints", soak.submitted, cluster.node_names)
        return check.shared_memory(folders, workers(soak))

    started = time.time()
    with LocalCluster(home, nodes=3, slots=2, settings=settings) as cluster:
        fds_before = service_fds(cluster)
        try:
            soak.run(cluster)
            # Ended tasks' in-memory copies are freed by their nodes' agents, shortly after the end.
            with contextlib.suppress(TimeoutError):
                cluster.wait(lambda: not in_memory(), 15, "in-memory copies to be freed")
        finally:
            tasks, events = cluster.get("/v1/tasks"), cluster.get("/v1/events", limit=1_000_000)
            fds_after = service_fds(cluster)
            left_in_memory = sorted(in_memory())
    elapsed = time.time() - started
    check.until(lambda: not check.processes_of(home), 10)  # processes killed on close are reaped
    left = check.processes_of(home)
    leaks = {
        "processes": left,
        "listening_ports": sorted(leftovers.listening_ports([*left, os.getpid()]) - ports),
        "shared_memory": left_in_memory,
        "fds": {"before": fds_before, "after": fds_after},
    }
    want = wanted.result()
    trainer.shutdown()
    return {
        **report.summary(soak, tasks, events, want, leaks, elapsed),
        "ladder": ladder,
        "settings": settings,
    }


def workers(soak: Soak) -> set[int]:
    """The pids of every worker the soak's tasks started (from their traces)."""
    pids = set()
    for trace in (soak.root / "traces").glob("*.jsonl"):
        for row in check.rows_of(trace):
            if row.get("what") == "started":
                pids.add(int(row["pid"]))
    return pids


def service_fds(cluster: LocalCluster) -> dict[str, int]:
    """Open file descriptors of the coordinator and of each agent."""
    out = {"coordinator": check.open_fds(cluster.coordinator.pid) if cluster.coordinator else 0}
    out.update({name: check.open_fds(agent.pid) for name, agent in sorted(cluster.agents.items())})
    return out


def fd_growth(fds: dict[str, dict[str, int]]) -> int:
    """The largest growth of one service's descriptors from the start to the end (a restarted
    service is compared with the start of its kind)."""
    before, after = fds["before"], fds["after"]
    agents = max((v for k, v in before.items() if k != "coordinator"), default=0)
    return max((v - before.get(k, agents) for k, v in after.items()), default=0)

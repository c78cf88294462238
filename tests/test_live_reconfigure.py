"""Cluster-wide reconfiguration across concurrent tasks, through real processes.

Three tasks of different weights share 4 nodes x 2 slots as the planner divides them. A node
of the heaviest task is lost: the allocation must become the planner's optimum for 3 nodes (the
lightest task gives way, the heaviest grows back onto its slots in place), answered from the
precomputed plan table. The node returns: the optimum for 4 nodes again. Every task then
finishes with every step trained on exactly its global batch, and with the parameters of a
failure-free run.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from unicron.control.launch.localcluster import LocalCluster
from unicron.core.specs import ClusterSpec, TaskSpec
from unicron.planning.planner import ClusterState, plan

from .test_live_cluster import (
    ARGS,
    TRAIN,
    assert_ends_exact,
    assert_ledger_exact,
    delay_file,
    full_speed,
    prefetch_reference,
    read_trace,
)

ITERATIONS = 160
# Every task must still run when the 3-node optimum is checked: alpha's newcomers (and, after the
# return, gamma's relaunch) took 10-17 s to start on a slow day here, and at 0.05 s a step alpha
# once ended before it grew back (CI: the optimum for 3 nodes never seen). A step's pause changes
# no parameter, so it is free; so is beta's length (it is compared with no failure-free run).
STEP_DELAY_S = 0.2
ITERATIONS_OF = {"alpha": ITERATIONS, "beta": 2 * ITERATIONS, "gamma": ITERATIONS}
# The planner's hardware, from a --cluster file (the coordinator records what it read).
GPU_FLOPS, NODE_MTBF_HOURS = 2.0e12, 750
TASKS = {  # name -> (weight, throughput table, seed)
    "alpha": (3, {2: 2.0e9, 4: 3.8e9}, 0),
    "beta": (2, {2: 2.0e9, 4: 2.6e9}, 1),
    "gamma": (1, {2: 2.0e9, 4: 3.0e9}, 2),
}


def spec_yaml(name: str, trace: Path) -> str:
    """``name``'s spec; its steps pause STEP_DELAY_S until :func:`full_speed` lifts the pause."""
    weight, table, seed = TASKS[name]
    delay = ["--step-delay", str(STEP_DELAY_S), "--step-delay-file", str(delay_file(trace))]
    program = ", ".join(["python", str(TRAIN), *ARGS, "--seed", str(seed), *delay])
    return (
        f"name: {name}\nweight: {weight}\nthroughput: {json.dumps(table)}\nrun:\n"
        f"  program: [{program}]\n  iterations: {ITERATIONS_OF[name]}\n  checkpoint_every: 10\n"
        f"  env: {{UNICRON_TRACE_FILE: {trace}}}\n"
    )


def seed_args(seed: int) -> list[str]:
    """The trainer's arguments for ``seed`` in a failure-free run's key: none for its default, 0,
    so that alpha is compared with the run other tests of as many steps train."""
    return ["--seed", str(seed)] if seed else []


def optimum(nodes: int) -> dict[str, int]:
    """The planner's answer for a cluster of ``nodes`` nodes running these tasks."""
    tasks = [TaskSpec(name=n, weight=w, throughput=t) for n, (w, t, _) in TASKS.items()]
    cluster = ClusterSpec(nodes=nodes, gpus_per_node=2, gpu=GPU_FLOPS, node_mtbf_hours=NODE_MTBF_HOURS)
    return plan(ClusterState.from_specs(cluster, tasks)).allocation()


def returned(cluster: LocalCluster, node: str, full: dict[str, int]) -> bool:
    """The node's return was answered with ``full``, and gamma was launched on it after."""
    events = cluster.get("/v1/events", limit=100_000)
    answers = [
        e["id"]
        for e in events
        if e["kind"] == "plan"
        and f"node-back:{node}" in (e["detail"]["answers"] or "").split(", ")
        and {t: n for t, n in e["detail"]["allocation"].items() if n} == full
    ]
    launches = [e["id"] for e in events if e["kind"] == "task_launch" and e["task"] == "gamma"
                and node in e["detail"]["placement"]]  # fmt: skip
    return bool(answers) and any(at > answers[0] for at in launches)


def allocation(cluster: LocalCluster) -> dict[str, int]:
    """Workers per task, counting only tasks that run."""
    return {n: (t["workers"] if t["state"] == "running" else 0) for n in TASKS for t in [cluster.task(n)]}


@pytest.mark.timeout(900)
def test_allocation_follows_the_optimum_through_loss_and_return(tmp_path: Path) -> None:
    traces = {name: tmp_path / f"{name}.jsonl" for name in TASKS}
    for name in ("alpha", "gamma"):  # the tasks compared with a failure-free run at the end
        prefetch_reference(ITERATIONS, seed_args(TASKS[name][2]))
    hardware = tmp_path / "cluster.yaml"
    hardware.write_text(f"gpu: {GPU_FLOPS}\nnode_mtbf_hours: {NODE_MTBF_HOURS}\n")
    with LocalCluster(tmp_path / "cluster", nodes=4, slots=2, cluster=hardware) as cluster:
        # The agents' registrations ask for a plan at the coordinator's next tick (every 0.1 s);
        # a submission that came before it would be planned then, solved while its table is
        # still being built, and the lookup this test checks would not be made.
        time.sleep(0.5)
        # The three in one request: planned together, so no task is placed for a cluster of fewer
        # tasks first (beta started on four workers, then gave two to gamma: two more starts).
        cluster.submit(yaml.safe_dump({"tasks": [yaml.safe_load(spec_yaml(n, traces[n])) for n in TASKS]}))
        full = optimum(4)
        assert full == {"alpha": 4, "beta": 2, "gamma": 2}
        cluster.wait(
            lambda: allocation(cluster) == full and min(cluster.task(n)["step"] for n in TASKS) >= 5,
            300,
            f"the optimum for 4 nodes {full}",
        )
        workers = cluster.get("/v1/workers")
        alpha_nodes = sorted({w["node"] for w in workers if w["task"] == "alpha" and w["state"] == "running"})
        lost = next(n for n in alpha_nodes if all(w["task"] == "alpha" for w in workers if w["node"] == n))
        killed = frozenset(w["rank"] for w in workers if w["node"] == lost and w["task"] == "alpha")
        cluster.kill_node(lost)
        three = optimum(3)
        assert three == {"alpha": 4, "beta": 2, "gamma": 0}
        cluster.wait(
            lambda: allocation(cluster) == three and cluster.task("gamma")["state"] == "waiting",
            300,
            f"the optimum for 3 nodes {three}",
        )
        cluster.start_agent(lost)
        # The return is answered with the 4-node optimum, and gamma starts again on the node that
        # returned. Not "all three run at it at once": gamma's relaunch took 13 s here on a slow
        # day, and alpha (or beta) may have finished meanwhile, as the plan then allows.
        cluster.wait(lambda: returned(cluster, lost, full), 300, f"the optimum for 4 nodes again {full}")
        for trace in traces.values():  # the rest is training to the end, compared with a failure-free run
            full_speed(trace)
        cluster.wait(
            lambda: all(cluster.task(n)["state"] == "finished" for n in TASKS), 600, "every task to finish"
        )
        events = cluster.get("/v1/events")
    started = next(e["detail"] for e in events if e["kind"] == "coordinator_started")
    assert (started["peak_flops"], started["node_mtbf_hours"]) == (GPU_FLOPS, NODE_MTBF_HOURS)  # the file's
    plans = [e["detail"] for e in events if e["kind"] == "plan"]
    # The first submission, the loss and the return were answered from the precomputed table.
    # (A plan names every event it answers, "node-back:node-0, task-arrived:alpha,beta,gamma".)
    told = [a for p in plans if p["source"] == "table" and p["answers"] for a in p["answers"].split(", ")]
    answered = {a.split(":")[0] for a in told}
    assert {"task-arrived", "node-lost", "node-back"} <= answered, plans
    assert f"node-lost:{lost}" in told, plans  # the node, by its name
    kinds = [(e["kind"], e["task"]) for e in events]
    # alpha recovered in place and grew back in place: it was launched once.
    assert kinds.count(("task_launch", "alpha")) == 1, kinds
    assert ("task_grown", "alpha") in kinds
    for name in TASKS:
        seed = TASKS[name][2]
        # alpha's ranks on the lost node may have died between a completed all-reduce and
        # their ledger lines.
        frozen = killed if name == "alpha" else frozenset()
        assert_ledger_exact(read_trace(traces[name]), ITERATIONS_OF[name], seed, frozen=frozen)
        if name != "beta":  # beta never changed; alpha and gamma must equal a failure-free run
            assert_ends_exact(tmp_path, name, ITERATIONS, seed_args(seed))


def test_helpers_agree_with_the_demo_file() -> None:
    """The tables here are the demo's (examples/demo/tasks.yaml), so the demo shows this too."""
    demo: dict[str, Any] = yaml.safe_load(Path("examples/demo/tasks.yaml").read_text())
    tables = {
        t["name"]: (t["weight"], {k: float(v) for k, v in t["throughput"].items()}) for t in demo["tasks"]
    }
    assert tables == {n: (w, t) for n, (w, t, _) in TASKS.items()}

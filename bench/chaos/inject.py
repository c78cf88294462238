"""Faults from outside the workers, struck at a live local cluster (the soak's ``Strike``s).

Each returns what it struck (for the record) or None when it found nothing to strike (no
running worker, no checkpoint yet); node faults bring the node back before returning, so that
at most one node is away at a time and the cluster's capacity returns between strikes.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from bench.chaos.schedule import ITERATIONS, Strike
from unicron.control.launch.localcluster import LocalCluster

LOST_WITHIN_S = 30.0  # a frozen node must be declared lost within this


def strike(cluster: LocalCluster, fault: Strike) -> str | None:
    """Carry out ``fault``; returns its target, or None when there was none."""
    if fault.kind in ("worker_kill", "worker_hang"):
        return _worker(cluster, fault)
    if fault.kind == "coordinator_kill":
        cluster.kill_coordinator()
        time.sleep(fault.pause_s)
        cluster.start_coordinator()
        return "coordinator"
    if fault.kind == "checkpoint_corrupt":
        return _corrupt(cluster, fault)
    return _node(cluster, fault)


def _running(cluster: LocalCluster) -> list[dict[str, object]]:
    workers = [w for w in cluster.get("/v1/workers") if w["state"] == "running" and w["pid"]]
    return sorted(workers, key=lambda w: (str(w["task"]), int(str(w["rank"]))))


def _worker(cluster: LocalCluster, fault: Strike) -> str | None:
    workers = _running(cluster)
    if not workers:
        return None
    chosen = workers[fault.pick % len(workers)]
    sig = signal.SIGKILL if fault.kind == "worker_kill" else signal.SIGSTOP
    try:
        os.kill(int(str(chosen["pid"])), sig)
    except ProcessLookupError:
        return None
    return f"{chosen['task']} rank {chosen['rank']} on {chosen['node']}"


def _corrupt(cluster: LocalCluster, fault: Strike) -> str | None:
    """Truncate the newest persistent checkpoint of a running task (a torn write); the task's
    final checkpoint comes later and is not struck."""
    running = {t["name"] for t in cluster.get("/v1/tasks") if t["state"] == "running"}
    # Not the final one (a task still "running" may have saved it already): nothing reads it
    # back to repair it, so striking it would test the soak, not the recovery.
    final = f"step-{ITERATIONS:08d}.pt"
    folders = sorted(
        p for p in (cluster.root / "checkpoints").glob("*") if p.name in running and _struck(p, final)
    )
    if not folders:
        return None
    newest = sorted(c for c in folders[fault.pick % len(folders)].glob("step-*.pt") if c.name != final)[-1]
    try:
        size = newest.stat().st_size
        with newest.open("r+b") as f:
            f.truncate(size // 2)
    except FileNotFoundError:  # pruned meanwhile
        return None
    return str(newest.relative_to(cluster.root))


def _struck(folder: Path, final: str) -> bool:
    """Whether ``folder`` holds a checkpoint the soak may truncate (any but the final one)."""
    return any(c.name != final for c in folder.glob("step-*.pt"))


def _node(cluster: LocalCluster, fault: Strike) -> str | None:
    """Freeze, lose or kill the agent of one node; bring it back; returns its name."""
    up = sorted(cluster.agents)
    if len(up) < len(cluster.node_names):
        return None  # one node away at a time
    node = up[fault.pick % len(up)]
    if fault.kind == "node_freeze":
        cluster.freeze_node(node)
        cluster.wait(lambda: _state(cluster, node) == "lost", LOST_WITHIN_S, f"{node} to be declared lost")
        cluster.reboot_frozen()
    elif fault.kind == "node_loss":
        cluster.kill_node(node)
    else:  # agent_kill: the agent alone (its workers die with it)
        agent = cluster.agents.pop(node)
        os.killpg(agent.pid, signal.SIGKILL)
        agent.wait(10)
    time.sleep(fault.pause_s)
    cluster.start_agent(node)
    cluster.wait(lambda: _state(cluster, node) in ("healthy", "isolated"), 60, f"{node} to come back")
    return node


def _state(cluster: LocalCluster, node: str) -> str:
    return str(next((n["state"] for n in cluster.get("/v1/nodes") if n["name"] == node), "unknown"))

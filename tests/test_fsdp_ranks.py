"""The FSDP example (examples/fsdp: FSDP2 inside each data-parallel replica) on real gloo ranks,
without a cluster: spawned processes given the worker contract an agent gives them
(``core.workerenv``), with the task's store served as the coordinator serves it. What the run
shows is the library's: FSDP's reductions are ones gloo takes in the demo's float32, and one
replica of two ranks (no sum across replicas at all: FSDP's reduce-scatter holds the whole step)
ends with the parameters of the unsharded failure-free run. A sharded replica's failure and
replacement, and a sharded checkpoint resumed at another replica count, run through the real
stack in test_live_sharded.py."""

from __future__ import annotations

import multiprocessing as mp
import os
import runpy
import sys
import traceback
from pathlib import Path
from typing import Any

from unicron.control.act.rendezvous import Rendezvous
from unicron.core.protocol import Current, current_key
from unicron.core.workerenv import WorkerEnv

from .spawned import run_ranks

# (not conftest's ROOT: each rank imports this module, and conftest imports the coordinator)
FSDP = Path(__file__).resolve().parents[1] / "examples" / "fsdp" / "train.py"
GENERATION = 1


def _rank(rank: int, port: int, out: mp.Queue, env: dict[str, str], argv: list[str]) -> None:  # type: ignore[type-arg]
    """One worker of the task: the example's ``__main__`` with an agent's environment."""
    try:
        os.environ.update(env)
        os.environ.update({"UNICRON_RANK": str(rank), "UNICRON_LOCAL_RANK": str(rank)})
        sys.argv = [str(FSDP), *argv]
        runpy.run_path(str(FSDP), run_name="__main__")
        out.put((rank, "finished"))
    except BaseException:
        out.put((rank, traceback.format_exc()))


def run_task(tmp_path: Path, world: int, iterations: int, argv: list[str]) -> list[dict[str, Any]]:
    """Run the example as task ``lm`` of ``world`` ranks in replicas of two, its checkpoints in
    ``tmp_path/cluster/checkpoints/lm`` (where ``assert_ends_exact`` looks); its trace rows."""
    from .test_live_cluster import read_trace

    trace = tmp_path / "trace.jsonl"
    rendezvous = Rendezvous("127.0.0.1", os.urandom(64))
    port = rendezvous.host("lm")
    current = Current(generation=GENERATION, launched=GENERATION)
    rendezvous.set("lm", current_key("lm"), current.model_dump_json())  # whose commits the fence lets in
    contract = WorkerEnv(
        task="lm",
        generation=GENERATION,
        world_size=world,
        replica_size=2,
        store=f"127.0.0.1:{port}",
        store_key=rendezvous.key("lm"),
        checkpoint_dir=str(tmp_path / "cluster" / "checkpoints" / "lm"),
        iterations=iterations,
        checkpoint_every=10,
        trace_file=str(trace),
        host_checkpoints=False,
    )
    try:
        results = run_ranks(_rank, world, contract.to_env(), argv)
    finally:
        rendezvous.close_all()
    assert results == dict.fromkeys(range(world), "finished"), results
    return read_trace(trace)


def test_a_sharded_task_trains_in_float32(tmp_path: Path) -> None:
    """The demo's precision (the other tests use float64 to compare exactly): FSDP's reductions
    must be ones gloo takes (plain sums). Two replicas of two ranks, each rank holding a part."""
    from unicron.train.checkpoint import load_latest

    from .test_live_cluster import MODEL

    rows = run_task(tmp_path, 4, 6, [*MODEL, "--global-batch", "16", "--micro-batch", "2"])
    shards = [r for r in rows if r["what"] == "sharded"]
    assert len(shards) == 4 and all(r["parameters"] < r["of"] for r in shards), shards
    final = load_latest(tmp_path / "cluster" / "checkpoints" / "lm")
    assert final is not None and final["step"] == 6 and final["replica_size"] == 2


def test_one_sharded_replica_ends_exact(tmp_path: Path) -> None:
    """One replica of two ranks: the same result as the unsharded run, every step on its batch."""
    from .test_live_cluster import ARGS, assert_ends_exact, assert_ledger_exact, prefetch_reference

    iterations = 8
    prefetch_reference(iterations)  # trained beside the ranks
    rows = run_task(tmp_path, 2, iterations, ARGS)
    assert len([r for r in rows if r["what"] == "sharded"]) == 2
    assert_ledger_exact(rows, iterations, world=2, replica_size=2)
    assert_ends_exact(tmp_path, "lm", iterations)

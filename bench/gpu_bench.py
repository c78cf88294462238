"""What one GPU can show (issue 14), run on a machine with a CUDA GPU; and, on that machine's
CPUs with the GPU hidden, the overhead cells of issues 12 and 14 where workers are fewer than
cores (the 2-core development machine cannot separate a 2% gap from its noise).

    python -m bench.gpu_bench OUT_DIR gpu     # the GPU checks: OUT_DIR/gpu.json
    python -m bench.gpu_bench OUT_DIR cpu     # the CPU cells: OUT_DIR/overhead-cpu.json
    python -m bench.gpu_bench DIR --docs      # DIR's JSON merged into docs/bench/; docs/gpu.md

``--only a,b`` runs the named checks alone; ``--budget S`` starts none after S seconds;
``--side-by-side`` (cpu) runs issue 12's cells with both sides at once (``bench/side_by_side.py``).

The GPU checks, each recorded with its error if it fails (a failure does not stop the rest):
the session's group code on NCCL (``bench/nccl_check.py``); a world of one trained on the GPU
under Unicron, killed mid-run and restarted from the node's in-memory checkpoint copy (written
from GPU memory), ending with the parameters and optimizer state of the same task run without
a fault (float64); failure-free step time on the GPU against torchrun (DDP on NCCL, and FSDP2
for the sharded example's model), same script, same run. Nothing here runs in ``make test``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from bench.overhead_bench import MODELS, PORT, ROOT, Model, measure
from bench.overhead_verdict import MIN_PAIRS
from bench.pinning import threads
from bench.side_by_side import measure as side_by_side_cell
from unicron.control.launch.localcluster import LocalCluster
from unicron.train.checkpoint import load_latest

GPUS = ["0"]  # the agent's --gpus: its one slot's GPU
# The GPU cells: the overhead models, more steps (a GPU step takes milliseconds); the sharded
# example's model at a world of one (FSDP2 over one rank under torchrun; unsharded under Unicron).
GPU_MODELS = {
    "tinygpt": replace(MODELS["tinygpt"], runs=2, iterations=300, workers=(1,), torchft=False),
    "gpt-10m": replace(MODELS["gpt-10m"], runs=2, iterations=200, workers=(1,), torchft=False),
    "gpt-20m-fsdp": replace(
        MODELS["gpt-20m-hsdp"],
        baseline_args=("--replica-size", "1"),
        runs=2,
        iterations=100,
        workers=(1,),
        replica_size=1,
    ),
}
# The CPU cells on the GPU machine's cores: every overhead row, pinned (``bench/pinning.py``);
# issue 12's with the fewest runs a cell can be judged by (``MIN_PAIRS``), shorter where a run is long.
CPU_MODELS = {
    # (torchft is not installed on the GPU machine's image; its row is measured here.)
    "tinygpt": replace(MODELS["tinygpt"], runs=MIN_PAIRS, torchft=False),
    "gpt-10m": replace(MODELS["gpt-10m"], runs=MIN_PAIRS, iterations=30, torchft=False),
    "gpt-20m-hsdp": replace(MODELS["gpt-20m-hsdp"], runs=2, iterations=16),
}
# The same cells with both sides at the same time (``bench/side_by_side.py``, ``--side-by-side``),
# named with SIDE after the cell's name; more steps, as only those both sides ran at once count
# (torchrun's side starts ~2 s sooner).
SIDE = "-side"
SIDE_MODELS = {
    "tinygpt": replace(CPU_MODELS["tinygpt"], iterations=400),
    "gpt-10m": replace(CPU_MODELS["gpt-10m"], iterations=60),
}
# In this order: issue 12's cells (the ddp-port models; gpt-10m first, the model where
# communication matters, and the cells the 2-core machine leaves unresolved before the 1-worker
# ones), then issue 14's sharded cells (a call can run out of time: see ``--budget``).
CPU_CELLS = [
    ("gpt-10m", 2),
    ("gpt-10m", 4),
    ("tinygpt", 2),
    ("tinygpt", 4),
    ("tinygpt", 1),
    ("gpt-10m", 1),
    ("gpt-20m-hsdp", 2),
    ("gpt-20m-hsdp", 4),
]
RECOVERY_ARGS = ("--dtype", "float64", "--layers", "4", "--hidden", "256", "--heads", "4")
RECOVERY_STEPS, KILL_AT = 40, 23


def machine() -> dict[str, Any]:
    gpu = torch.cuda.is_available()
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0) if gpu else None,
        "gpu_memory_gib": round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1) if gpu else None,
        "cpus": os.cpu_count(),
        # Hardware threads grouped by physical core: pinned cells leave a worker's siblings idle.
        "physical_cores": [sorted(group) for group in threads(os.sched_getaffinity(0))],
        "python": platform.python_version(),
    }


class Sections:
    """The checks of one call, each saved into ``out`` as it ends (checks already there are kept,
    a rerun one replaced); ``only``: the names to run (empty: all); none starts once
    ``deadline`` (``time.monotonic``) has passed, so that a call ends inside the device's time
    limit with the cells it finished, and no cell is cut short."""

    def __init__(self, out: Path, machine_info: dict[str, Any], only: set[str], deadline: float) -> None:
        self.out, self.only, self.deadline = out, only, deadline
        out.parent.mkdir(parents=True, exist_ok=True)  # before any check: none is run for nothing
        self.result: dict[str, Any] = {"machine": machine_info}
        if out.is_file():  # an earlier call's checks on this machine stay (this call's replace theirs)
            self.result = json.loads(out.read_text()) | self.result

    def run(self, name: str, check: Callable[[], Any]) -> None:
        """Run one check into ``result[name]`` (its error instead, if it fails) and save at once."""
        if self.only and name not in self.only:
            return
        if time.monotonic() > self.deadline:
            print(f"{name}: not started (the call's budget is spent)", flush=True)
            return
        started, entry = time.monotonic(), {}
        try:
            entry = {"ok": True, "value": check()}
        except Exception as exc:
            entry = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            entry["where"] = traceback.format_exc().splitlines()[-8:]
        entry["seconds"] = round(time.monotonic() - started, 1)
        self.result[name] = entry
        self.out.write_text(json.dumps(self.result, indent=2) + "\n")
        print(f"{name}: {'ok' if entry['ok'] else entry['error']} ({entry['seconds']} s)", flush=True)


def nccl(root: Path) -> Any:
    report = root / "nccl.json"
    cmd = [sys.executable, str(ROOT / "bench" / "nccl_check.py"), str(report)]
    subprocess.run(cmd, check=False, timeout=180, capture_output=True)
    return json.loads(report.read_text())


def recovery_spec(name: str, trace: Path, faults: str) -> str:
    program = json.dumps(["python", str(PORT / "train_unicron.py"), *RECOVERY_ARGS])
    return (
        f"name: {name}\nweight: 1\nthroughput: {{1: 1.0e9}}\nmin_workers: 1\n"
        f"run:\n  program: {program}\n  iterations: {RECOVERY_STEPS}\n  checkpoint_every: 5\n"
        f"  env: {{UNICRON_TRACE_FILE: {trace}}}\n{faults}"
    )


def ended(cluster: LocalCluster, task: str) -> bool:
    return cluster.task(task)["state"] in ("finished", "failed")


def recovery(root: Path) -> dict[str, Any]:
    """A world of one on the GPU: a failure-free task, then the same task with its worker killed
    at step ``KILL_AT``; where the restarted worker resumed from, and how far apart the two
    final states are (0.0: the same bits)."""
    trace = root / "trace.jsonl"
    kill = f"  faults:\n    - {{action: kill, rank: 0, step: {KILL_AT}, generation: 1}}\n"
    with LocalCluster(root / "cluster", nodes=1, slots=1, gpus=GPUS) as cluster:
        for name, faults in (("reference", ""), ("killed", kill)):
            cluster.submit(recovery_spec(name, trace, faults))
            cluster.wait(functools.partial(ended, cluster, name), 600, f"task {name} to end")
        states = {n: cluster.task(n)["state"] for n in ("reference", "killed")}
        launches = sum(e["kind"] == "task_launch" for e in cluster.get("/v1/events", task="killed"))
    rows = [json.loads(line) for line in trace.read_text().splitlines()]
    resumed = [(r["source"], r["step"]) for r in rows if r["what"] == "resumed" and r["task"] == "killed"]
    finals = {n: load_latest(root / "cluster" / "checkpoints" / n) for n in ("reference", "killed")}
    ref, got = finals["reference"], finals["killed"]
    assert ref is not None and got is not None, f"no final checkpoint: {states}"
    model_diff = max(float((ref["model"][k] - got["model"][k]).abs().max()) for k in ref["model"])
    moments = [
        (a[key] - b[key]).abs().max()
        for a, b in zip(ref["optimizer"]["state"].values(), got["optimizer"]["state"].values(), strict=True)
        for key in ("exp_avg", "exp_avg_sq")
    ]
    return {
        "states": states,
        "steps": [ref["step"], got["step"]],
        "killed_at_step": KILL_AT,
        "resumed_from": resumed,
        "task_launches": launches,
        "max_abs_param_diff": model_diff,
        "max_abs_optimizer_diff": float(max(moments)),
        "same_digest": ref["digest"] == got["digest"],
    }


def overhead(root: Path, models: dict[str, Model], gpus: list[str] | None) -> list[dict[str, Any]]:
    return [measure(root, name, workers, m, gpus) for name, m in models.items() for workers in m.workers]


def gpu(sections: Sections) -> None:
    with tempfile.TemporaryDirectory(prefix="unicron-gpu-") as tmp:
        root = Path(tmp)
        sections.run("nccl", lambda: nccl(root))
        sections.run("recovery", lambda: recovery(root / "recovery"))
        for name, m in GPU_MODELS.items():
            sections.run(f"overhead-{name}", functools.partial(overhead, root, {name: m}, GPUS))


def cpu(sections: Sections, side_by_side: bool = False) -> None:
    """The overhead cells on the CPUs, the GPU hidden from both sides (``CUDA_VISIBLE_DEVICES``
    empty: the scripts and the session then take the CPU and gloo), each worker pinned to a core
    of its own (16 cores leave the launchers, coordinator and agent cores of their own);
    ``side_by_side``: issue 12's cells with both sides at once (``SIDE_MODELS``)."""
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    with tempfile.TemporaryDirectory(prefix="unicron-cpu-") as tmp:
        for name, workers in CPU_CELLS:
            if side_by_side and name not in SIDE_MODELS:
                continue
            if side_by_side:
                m, how, called = SIDE_MODELS[name], side_by_side_cell, f"{name}-{workers}{SIDE}"
            else:
                m, how, called = CPU_MODELS[name], measure, f"{name}-{workers}"
            cell = functools.partial(how, Path(tmp), name, workers, m, pin=True)
            sections.run(called, functools.partial(as_rows, cell))
            keep_step_times(Path(tmp), sections.out.parent / "step-times.json")


def keep_step_times(runs: Path, kept: Path) -> None:
    """Every run's raw step-end times (``bench/steptimes.py``'s records) kept in one JSON beside
    the cells' (a device call brings back only a few files), so that why one side's runs differ
    (start-up, a slow stretch, a slower level throughout) can be read afterwards: the cells'
    JSON keeps only each run's median. ``kept``: {run folder: {record name: step ends}}, and
    {pair's folder: {"census": ...}} for the pairs run side by side (``bench/census.py``)."""
    times = json.loads(kept.read_text()) if kept.is_file() else {}
    for record in runs.rglob("times/steps-*.json"):  # a run's folder, or a side's in a pair's
        run = str(record.parent.parent.relative_to(runs))
        times.setdefault(run, {})[record.name] = json.loads(record.read_text())
    for census in runs.rglob("census.json"):
        times.setdefault(str(census.parent.relative_to(runs)), {})["census"] = json.loads(census.read_text())
    kept.write_text(json.dumps(times))


def as_rows(cell: Callable[[], dict[str, Any]]) -> list[dict[str, Any]]:
    return [cell()]


MODES = {"gpu": (gpu, "gpu.json"), "cpu": (cpu, "overhead-cpu.json")}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "out", type=Path, help="the folder the JSON goes to (--docs: the folder to take it from)"
    )
    parser.add_argument("mode", nargs="?", choices=sorted(MODES), help="which checks (omit with --docs)")
    parser.add_argument("--only", default="", help="comma-separated check names to run (default: all)")
    parser.add_argument("--side-by-side", action="store_true", help="cpu: both sides of each cell at once")
    parser.add_argument("--budget", type=float, default=1e9, help="seconds after which no check starts")
    parser.add_argument(
        "--docs", action="store_true", help="merge OUT's JSON into docs/bench/, write docs/gpu.md"
    )
    args = parser.parse_args(argv)
    if args.docs:
        from bench import gpu_docs

        gpu_docs.write(args.out)
        return
    if args.mode is None:
        parser.error("mode: say gpu or cpu (or pass --docs)")
    run, filename = MODES[args.mode]
    info = machine() | ({"gpu": None} if args.mode == "cpu" else {})
    deadline = time.monotonic() + args.budget
    sections = Sections(args.out / filename, info, set(filter(None, args.only.split(","))), deadline)
    if args.mode == "cpu":
        cpu(sections, args.side_by_side)
    else:
        run(sections)


if __name__ == "__main__":
    main(sys.argv[1:])

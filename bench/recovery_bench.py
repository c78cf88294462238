"""Recovery cost per failure class: Unicron (in place) against torchrun (restart from checkpoint).

Same script (examples/tinygpt, 4 gloo workers, float64), same fault library, same run.

- downtime_s: from the fault (the worker's own timestamp) to the next completed iteration (a
  step whose gradient all-reduce succeeded), from the workers' trace.
- lost_microbatches: micro-batches computed and then thrown away. Unicron: those the survivors
  recompute (the failed ranks' share of the step). torchrun: every micro-batch since the last
  checkpoint, on every rank, plus the failed step's.
- regain_s: until the step that failed is completed again (for torchrun this includes redoing the
  steps since the checkpoint).

Unicron also gets an exactness check: its final parameters against a failure-free run.
Writes docs/bench/recovery.json and docs/recovery.md (run by `make bench`).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from bench import cells, torchft_recovery
from bench.network_bench import cut_link_rows
from bench.torchrun import TRAIN, Torchrun, trace_rows
from unicron.control.launch.localcluster import LocalCluster
from unicron.train.checkpoint import load_latest

ROOT = Path(__file__).resolve().parents[1]
GLOBAL_BATCH, MICRO_BATCH = 16, 2
MICRO_PER_STEP = GLOBAL_BATCH // MICRO_BATCH
ARGS = [
    "--dtype",
    "float64",
    "--global-batch",
    str(GLOBAL_BATCH),
    "--micro-batch",
    str(MICRO_BATCH),
    "--dataset-size",
    "512",
    "--step-delay",
    "0.15",
]
CHECKPOINT_EVERY = 10
UNICRON_FAULTS = [  # (class, fault); steps chosen mid-way between checkpoints
    ("worker_crash", {"action": "kill", "rank": 1, "step": 25, "generation": 0}),
    ("crash_after_allreduce", {"action": "kill_after_reduce", "rank": 2, "step": 65, "generation": 0}),
    ("hang", {"action": "hang", "rank": 1, "step": 105, "generation": 0}),
    # Mid-step: dead inside its last backward pass, its peers' gradient buckets in flight.
    ("crash_in_backward", {"action": "kill_in_backward", "rank": 2, "step": 125, "generation": 0}),
]
ITERATIONS = 170


def measure(rows: list[dict[str, Any]], fault_time: float, generation: int) -> dict[str, float]:
    """Downtime: to the first iteration completed by the group that replaced the failed one (a
    later generation: the rebuilt group, or torchrun's relaunch). Regain: to the first step
    beyond everything completed before the fault."""
    samples = [r for r in rows if r["what"] == "samples"]
    prior = max((r["step"] for r in samples if r["time"] <= fault_time), default=0)
    later = [r for r in samples if r["time"] > fault_time and r["generation"] > generation]
    first = min(r["time"] for r in later)
    regain = min(r["time"] for r in later if r["step"] > prior)
    return {"downtime_s": round(first - fault_time, 3), "regain_s": round(regain - fault_time, 3)}


def lost_microbatches(rows: list[dict[str, Any]], fault_time: float) -> int:
    """Micro-batches recomputed because of this fault: the survivors' recomputation of the step
    that was in flight when it struck (or of the step just completed, when it struck after the
    all-reduce), within the recovery that followed it."""
    done = max((r["step"] for r in rows if r["what"] == "samples" and r["time"] <= fault_time), default=0)
    redone = sum(
        r["samples"]
        for r in rows
        if r["what"] == "recompute"
        and r["step"] in (done, done + 1)
        and fault_time < r["time"] < fault_time + 30
    )
    return -(-redone // MICRO_BATCH)


def unicron(root: Path) -> tuple[dict[str, dict[str, Any]], bool]:
    trace = root / "trace.jsonl"
    program = ", ".join(["python", str(TRAIN), *ARGS])
    spec = (
        f"name: lm\nweight: 1\nthroughput: {{2: 1.9e9, 3: 2.7e9, 4: 3.5e9}}\nrun:\n  program: [{program}]\n"
        f"  iterations: {ITERATIONS}\n  checkpoint_every: {CHECKPOINT_EVERY}\n"
        f"  env: {{UNICRON_TRACE_FILE: {trace}}}\n  faults: {json.dumps([f for _, f in UNICRON_FAULTS])}\n"
    )
    settings = {"hang_warmup_steps": 3, "hang_floor_s": 1.0, "isolate_after": 100, "max_restarts": 100}
    results: dict[str, dict[str, Any]] = {}
    with LocalCluster(root / "cluster", nodes=2, slots=2, settings=settings) as cluster:
        cluster.submit(spec)
        cluster.wait(
            lambda: (
                cluster.task("lm")["step"] >= 140
                and cluster.task("lm")["workers"] == 4
                and cluster.task("lm")["state"] == "running"
            ),
            400,
            "four recoveries",
        )
        killed = time.time()
        cluster.freeze_node("node-1")  # silent, connections open: as a machine losing power
        cluster.wait(lambda: cluster.task("lm")["state"] == "finished", 400, "the task to finish")
    rows = trace_rows(trace)
    for name, fault in UNICRON_FAULTS:
        mark = next(r for r in rows if r["what"] == "fault" and r["action"] == fault["action"])
        results[name] = {
            **measure(rows, mark["time"], mark["generation"]),
            "lost_microbatches": lost_microbatches(rows, mark["time"]),
        }
    before = max(r["generation"] for r in rows if r["what"] == "samples" and r["time"] <= killed)
    results["node_loss"] = {
        **measure(rows, killed, before),
        "lost_microbatches": lost_microbatches(rows, killed),
    }
    exact = _exact(root)
    return results, exact


def _exact(root: Path) -> bool:
    out = root / "reference"
    subprocess.run(
        [sys.executable, str(TRAIN), *ARGS, "--iterations", str(ITERATIONS), "--checkpoint-dir", str(out)],
        check=True,
        capture_output=True,
        timeout=900,
    )
    want, got = load_latest(out), load_latest(root / "cluster" / "checkpoints" / "lm")
    if want is None or got is None:
        return False
    return all(
        torch.allclose(got["model"][k], want["model"][k], rtol=1e-9, atol=1e-11) for k in want["model"]
    )


def torchrun_once(root: Path, fault: dict[str, Any], pg_timeout: float) -> dict[str, Any]:
    args = [*ARGS, "--iterations", str(fault["step"] + 15), "--checkpoint-every", str(CHECKPOINT_EVERY)]
    with Torchrun(root, fault, args, pg_timeout, max_restarts=2) as job:
        job.wait(min(pg_timeout, 60.0) + 60)
        rows = job.rows()
    injected = next(r["time"] for r in rows if r["what"] == "fault")
    # Every step since the last checkpoint is redone, the failed one included.
    steps_lost = fault["step"] - (fault["step"] // CHECKPOINT_EVERY) * CHECKPOINT_EVERY
    return {**measure(rows, injected, 1), "lost_microbatches": steps_lost * MICRO_PER_STEP}


def torchrun_frozen_node(root: Path, pg_timeout: float) -> dict[str, Any]:
    """Node loss under torchrun (one host): freeze ranks 2 and 3, a node's worth of workers."""
    step = 25
    args = [*ARGS, "--iterations", str(step + 15), "--checkpoint-every", str(CHECKPOINT_EVERY)]
    with Torchrun(root, None, args, pg_timeout, max_restarts=2) as job:
        frozen = job.freeze_node(after_step=step)
        job.wait(pg_timeout + 120)
        rows = job.rows()
    done = max(r["step"] for r in rows if r["what"] == "samples" and r["time"] <= frozen)
    lost = (done + 1) - ((done + 1) // CHECKPOINT_EVERY) * CHECKPOINT_EVERY
    return {
        **measure(rows, frozen, 1),
        "lost_microbatches": lost * MICRO_PER_STEP,
        "frozen_at_step": done + 1,
    }


def torchrun(root: Path) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    cases = {
        "worker_crash": ({"action": "kill", "rank": 1, "step": 25}, 1800.0),
        "crash_after_allreduce": ({"action": "kill_after_reduce", "rank": 2, "step": 25}, 1800.0),
        "hang": ({"action": "hang", "rank": 3, "step": 25}, 20.0),
        "crash_in_backward": ({"action": "kill_in_backward", "rank": 2, "step": 25}, 1800.0),
    }
    for name, (fault, timeout) in cases.items():
        for attempt in range(2):
            try:
                out[name] = {
                    **torchrun_once(root / f"{name}-{attempt}", fault, timeout),
                    "attempts": attempt + 1,
                }
                if name == "hang":
                    out[name]["process_group_timeout_s"] = timeout
                break
            except (StopIteration, ValueError):
                continue
        else:
            out[name] = {
                "downtime_s": None,
                "lost_microbatches": None,
                "note": "torchrun's relaunch never completed an iteration in two attempts",
            }
    try:
        out["node_loss"] = {**torchrun_frozen_node(root / "node_loss", 20.0), "process_group_timeout_s": 20.0}
    except (StopIteration, ValueError):
        out["node_loss"] = {"downtime_s": None, "lost_microbatches": None, "note": "no relaunch completed"}
    return out


def main() -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="unicron-recovery-") as tmp:
        ours, exact = unicron(Path(tmp) / "unicron")
        theirs = torchrun(Path(tmp) / "torchrun")
        peer = torchft_recovery.torchft(Path(tmp) / "torchft")
    result: dict[str, Any] = {
        c: {"unicron": ours[c], "torchrun": theirs.get(c), "torchft": peer.get(c)} for c in ours
    }
    result["exactness_held"] = exact
    crash_u, crash_t = (
        ours["worker_crash"]["downtime_s"],
        (theirs.get("worker_crash") or {}).get("downtime_s"),
    )
    result["worker_crash_ratio"] = round(crash_u / crash_t, 4) if crash_t else None
    return save(result)


def save(result: dict[str, Any]) -> dict[str, Any]:
    (ROOT / "docs" / "bench").mkdir(parents=True, exist_ok=True)
    (ROOT / "docs" / "bench" / "recovery.json").write_text(json.dumps(result, indent=2) + "\n")
    write_markdown(result)
    return result


def torchft_only() -> dict[str, Any]:
    """Measure the torchft entries alone into the last run's JSON (the other sides kept)."""
    result: dict[str, Any] = json.loads((ROOT / "docs" / "bench" / "recovery.json").read_text())
    with tempfile.TemporaryDirectory(prefix="unicron-torchft-") as tmp:
        peer = torchft_recovery.torchft(Path(tmp))
    for c in result:
        if isinstance(result[c], dict) and "unicron" in result[c]:
            result[c]["torchft"] = peer.get(c)
    result["torchft_measured_apart"] = True  # not in the same run as the other two sides
    return save(result)


def write_markdown(r: dict[str, Any]) -> None:
    classes = [c for c in r if isinstance(r[c], dict) and "unicron" in r[c]]
    keys = ("downtime_s", "regain_s", "lost_microbatches")
    rows = "\n".join(
        f"| {c.replace('_', ' ')} | "
        + " | ".join(cells.value(r[c][side], key) for key in keys for side in ("unicron", "torchrun"))
        + " |"
        for c in classes
    )
    rows = "\n".join([rows, *[row for kind, row in cut_link_rows().items() if kind == "recovery"]])
    template = (Path(__file__).parent / "templates" / "recovery.md").read_text()
    ratio = r["worker_crash_ratio"]
    (ROOT / "docs" / "recovery.md").write_text(
        template.format(
            rows=rows,
            torchft_rows=torchft_rows(r, classes),
            torchft_wins=torchft_wins(r, classes),
            torchft_late=torchft_late(r, classes),
            torchft_midstep=torchft_midstep(r),
            torchft_when=(
                "measured in a run of its own (`python -m bench.recovery_bench --torchft`), on the same "
                "machine, after the other two sides' run"
                if r.get("torchft_measured_apart")
                else "measured in the same run as the other two sides"
            ),
            exact="held" if r["exactness_held"] else "FAILED",
            ratio="not measured" if ratio is None else f"{ratio:.3f}",
        )
    )


def torchft_rows(r: dict[str, Any], classes: list[str]) -> str:
    keys = ("skipped_samples", "detection_s", "heal_s", "final_max_abs_diff")
    return "\n".join(
        f"| {c.replace('_', ' ')} | "
        + " | ".join(
            cells.value(r[c].get(side), key) for key in ("downtime_s", "lost_microbatches") for side in SIDES
        )
        + " | "
        + " | ".join(_peer_value(r[c].get("torchft"), key) for key in keys)
        + " |"
        for c in classes
    )


def _peer_value(entry: dict[str, Any] | None, key: str) -> str:
    if entry and key == "final_max_abs_diff" and entry.get(key) is not None:
        return f"{entry[key]:.1e}"
    return cells.value(entry, key)


def torchft_wins(r: dict[str, Any], classes: list[str]) -> str:
    """The classes where torchft's downtime or lost work is below Unicron's, said plainly."""
    wins = [
        f"{c.replace('_', ' ')} ({what})"
        for c in classes
        if (peer := r[c].get("torchft")) and peer.get("downtime_s") is not None
        for what, key in (("downtime", "downtime_s"), ("lost micro-batches", "lost_microbatches"))
        if peer.get(key) is not None and peer[key] < r[c]["unicron"][key]
    ]
    return ", ".join(wins) if wins else "none"


def torchft_midstep(r: dict[str, Any]) -> str:
    """What a rank lost mid-step (its peers in the all-reduce) cost each side."""
    cell = r.get("crash_in_backward") or {}
    peer, ours = cell.get("torchft"), cell.get("unicron")
    if not peer or peer.get("lost_steps") is None or not ours:
        return "not measured"
    return (
        f"torchft's survivors voted {peer['lost_steps']} step(s) down, throwing away the "
        f"{peer['lost_microbatches']} micro-batches they had computed for it, and that step's "
        f"samples are not trained on; Unicron's survivors recomputed {ours['lost_microbatches']} "
        "(the failed rank's share) and completed the step"
    )


def torchft_late(r: dict[str, Any], classes: list[str]) -> str:
    """The cells whose first quorum lacked a group (it started late and healed into step 1)."""
    late = [
        f"{c.replace('_', ' ')} ({peer['first_quorum_groups']} of 4)"
        for c in classes
        if (peer := r[c].get("torchft")) and (peer.get("first_quorum_groups") or 4) < 4
    ]
    return ", ".join(late) if late else "none"


SIDES = ("unicron", "torchft")

if __name__ == "__main__":
    if sys.argv[1:] == ["--torchft"]:
        print(json.dumps(torchft_only(), indent=2))
    elif sys.argv[1:] == ["--docs"]:  # the page again from the last measured figures (a text change)
        write_markdown(json.loads((ROOT / "docs" / "bench" / "recovery.json").read_text()))
    else:
        print(json.dumps(main(), indent=2))

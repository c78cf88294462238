"""Detection latency per fault class: Unicron against torchrun, same workload, same run.

Unicron: a task on an embedded local cluster (coordinator + 2 agents x 2 slots, real PyTorch
workers over gloo) gets one fault per generation from the fault-injection library; latency is
from the injection (the worker's FaultReport) to the coordinator's incident. Node loss is the
harness freezing a node (SIGSTOP of its agent and workers: silent, connections left open, as when
a machine loses power); latency to the coordinator's node_lost event.

torchrun: the same script and faults under `torch.distributed.run` (4 workers, one node, gloo);
torchrun has no detection events, so its latency is from the injection to its first reaction
that the workers can observe: a SIGTERM to a survivor, a survivor's collective error (its exit
is what torchrun's monitor sees next), or the relaunch. For hangs, torchrun relies on the
process-group timeout: measured with a tuned 20 s timeout; with the default (30 min for gloo) it
is the configured value, not measured. Node loss under torchrun (one host): the harness freezes
ranks 2 and 3, a node's worth of workers, the same way; torchrun's agent sees nothing wrong with
stopped processes, so the first reaction is again a survivor's collective timing out.

Writes docs/bench/detection.json and docs/detection.md (run by `make bench`).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import cells, torchft_recovery, torchft_side
from bench.network_bench import cut_link_rows
from bench.overhead_docs import TORCHFT_VERSION
from bench.torchrun import TRAIN, Torchrun
from unicron.control.launch.localcluster import LocalCluster
from unicron.control.service.service import TICK_S
from unicron.core.settings import ORDERING, Settings

ROOT = Path(__file__).resolve().parents[1]
ARGS = ["--global-batch", "16", "--micro-batch", "2", "--dataset-size", "512", "--step-delay", "0.02"]
# The same hang on iterations of about half a second, where 3 x the mean outweighs the floor.
LONG_ARGS = [*ARGS[:-1], "0.5"]
LONG = "hang_long_iterations"
LABELS = {LONG: "hang (0.5 s iterations)"}
CLASSES = ("exception", "process_exit", "hang")
ACTIONS = {"exception": "raise", "process_exit": "kill", "hang": "hang"}
REPEATS = int(os.environ.get("UNICRON_BENCH_REPEATS", "3"))
TUNED_PG_TIMEOUT_S = 20.0
HEARTBEAT_S = Settings().heartbeat_interval_s
DEFAULT_GLOO_TIMEOUT_S = 1800.0  # torch.distributed's default for gloo (its docs: 30 minutes)
# Detection settings for the benchmark's short runs: a shorter warm-up and floor, and no
# isolation or escalation, so that every injection is measured the same way.
BENCH_SETTINGS = {"hang_warmup_steps": 3, "hang_floor_s": 1.0, "isolate_after": 100, "max_restarts": 100}
# torchft (issue 18): its cells of bench/torchft_recovery.py (4 replica groups of one rank, that
# benchmark's workload), the class each detection class is; detection: from the injection to
# the survivors' next quorum.
TORCHFT_CLASSES = {
    "exception": "exception",
    "process_exit": "worker_crash",
    "hang": "hang",
    "node_loss": "node_loss",
}
TORCHFT_REPEATS = 2


def summary(values: list[float]) -> dict[str, Any]:
    return {"median_s": statistics.median(values), "max_s": max(values), "samples": values}


def task_spec(
    name: str, iterations: int, faults: list[dict[str, Any]], args: list[str] = ARGS, every: int = 5
) -> str:
    program = ", ".join(["python", str(TRAIN), *args])
    return (
        f"name: {name}\nweight: 1\nthroughput: {{4: 1.0e9}}\nrun:\n  program: [{program}]\n"
        f"  iterations: {iterations}\n  checkpoint_every: {every}\n  faults: {json.dumps(faults)}\n"
    )


def unicron(root: Path) -> tuple[dict[str, dict[str, Any]], float, float]:
    results: dict[str, list[float]] = {c: [] for c in (*CLASSES, "node_loss")}
    with LocalCluster(root / "unicron", nodes=2, slots=2, settings=BENCH_SETTINGS) as cluster:
        mean = _injected_faults(cluster, results)
        _node_losses(cluster, results["node_loss"])
        long_target = _long_hangs(cluster, results)
    ours = {c: summary(v) for c, v in results.items() if v}
    return ours, mean, long_target


def _injected_faults(cluster: LocalCluster, results: dict[str, list[float]]) -> float:
    """Every class of fault, REPEATS times, in one task: each one's detection time, by class.
    Returns the median mean iteration time the hang detector judged against."""
    faults, step = [], 10
    for repeat in range(REPEATS):
        for index, cls in enumerate(CLASSES):
            generation = repeat * len(CLASSES) + index + 1
            faults.append(
                {"action": ACTIONS[cls], "rank": 1 + (generation % 3), "step": step, "generation": generation}
            )
            step += 10
    cluster.submit(task_spec("bench", step + 5, faults))
    cluster.wait(lambda: cluster.task("bench")["state"] in ("finished", "failed"), 900, "the bench task")
    means: list[float] = []
    for e in cluster.get("/v1/events", task="bench"):
        d = e["detail"]
        if e["kind"] == "incident" and d.get("detection_s") is not None:
            cls = {"task_hang": "hang", "exited_abnormally": "process_exit"}.get(d["kind"], "exception")
            results[cls].append(d["detection_s"])
        if e["kind"] == "hang_detected" and d.get("mean_s"):
            means.append(d["mean_s"])
    return statistics.median(means) if means else 0.0


def _node_losses(cluster: LocalCluster, seconds: list[float]) -> None:
    """Freeze an agent and its workers while a task trains on it, twice: seconds to the loss."""
    for repeat in range(2):
        name = f"node{repeat}"
        cluster.submit(task_spec(name, 400, []))
        cluster.wait(
            lambda n=name: cluster.task(n)["state"] == "running" and cluster.task(n)["step"] > 5,
            300,
            "training before the node loss",
        )
        killed = time.time()
        cluster.freeze_node("node-1")
        cluster.wait(lambda t=killed: bool(_losses_after(cluster, t)), 60, "the node loss")
        seconds.append(round(_losses_after(cluster, killed)[0]["time"] - killed, 4))
        cluster.start_agent("node-1")
        cluster.request("DELETE", f"/v1/tasks/{name}").raise_for_status()
        cluster.wait(
            lambda: any(n["name"] == "node-1" and n["state"] == "healthy" for n in cluster.get("/v1/nodes")),
            60,
            "the node back",
        )


def _losses_after(cluster: LocalCluster, t: float) -> list[dict[str, Any]]:
    return [e for e in cluster.get("/v1/events") if e["kind"] == "node_lost" and e["time"] > t]


def _long_hangs(cluster: LocalCluster, results: dict[str, list[float]]) -> float:
    """Hangs on longer iterations: one more task, one hang per generation. Returns the target
    (three mean iterations and a heartbeat) the detections are judged against."""
    faults = [
        {"action": "hang", "rank": 1 + g % 3, "step": 8 * g, "generation": g} for g in range(1, REPEATS + 1)
    ]
    # Checkpoints seldom: their saves are not what this measures.
    cluster.submit(task_spec("long", 8 * REPEATS + 6, faults, LONG_ARGS, every=100))
    cluster.wait(lambda: cluster.task("long")["state"] in ("finished", "failed"), 600, "the long task")
    long_means = []
    for e in cluster.get("/v1/events", task="long"):
        d = e["detail"]
        if e["kind"] == "incident" and d.get("detection_s") is not None:
            results.setdefault(LONG, []).append(d["detection_s"])
        if e["kind"] == "hang_detected" and d.get("mean_s"):
            long_means.append(d["mean_s"])
    return 3 * statistics.median(long_means) + HEARTBEAT_S if long_means else 0.0


def torchrun_once(root: Path, action: str, pg_timeout: float, args: list[str] = ARGS) -> float:
    """Seconds from the injection to torchrun's first reaction the workers can see."""
    fault = {"action": action, "rank": 1, "step": 10}
    with Torchrun(root, fault, [*args, "--iterations", "200"], pg_timeout) as job:
        deadline = time.time() + pg_timeout + 120
        while time.time() < deadline:
            rows = job.rows()
            injected = next((r["time"] for r in rows if r["what"] == "fault"), None)
            if injected is not None:
                reactions = [
                    r["time"]
                    for r in rows
                    if r["time"] >= injected
                    and (
                        (r["what"] in ("sigterm", "exception") and r["rank"] != 1)
                        or (r["what"] == "started" and r["generation"] == 2)
                    )
                ]
                if reactions:
                    return round(min(reactions) - injected, 4)
            time.sleep(0.1)
        raise TimeoutError(f"torchrun never reacted to {action}")


def torchrun_frozen_node(root: Path, pg_timeout: float) -> float:
    """Seconds from freezing ranks 2 and 3 to torchrun's first reaction the workers can see."""
    with Torchrun(root, None, [*ARGS, "--iterations", "400"], pg_timeout) as job:
        frozen = job.freeze_node()
        deadline = frozen + pg_timeout + 120
        while time.time() < deadline:
            reactions = [
                r["time"]
                for r in job.rows()
                if r["time"] >= frozen
                and (
                    (r["what"] in ("sigterm", "exception") and r["rank"] in (0, 1))
                    or (r["what"] == "started" and r["generation"] == 2)
                )
            ]
            if reactions:
                return round(min(reactions) - frozen, 4)
            time.sleep(0.1)
        raise TimeoutError("torchrun never reacted to the frozen node")


def torchrun(root: Path) -> dict[str, dict[str, Any]]:
    out = {}
    for cls in CLASSES:
        timeout = TUNED_PG_TIMEOUT_S
        values = [torchrun_once(root / f"{cls}-{i}", ACTIONS[cls], timeout) for i in range(REPEATS)]
        out[cls] = summary(values)
    frozen = [torchrun_frozen_node(root / f"node-{i}", TUNED_PG_TIMEOUT_S) for i in range(2)]
    out["node_loss"] = summary(frozen)
    long = [torchrun_once(root / f"long-{i}", "hang", TUNED_PG_TIMEOUT_S, LONG_ARGS) for i in range(2)]
    out[LONG] = summary(long)
    return out


def torchft(root: Path) -> dict[str, dict[str, Any]]:
    """torchft's detection per class: seconds from the injection to its survivors' next quorum
    (without the failed group, or with its restarted worker)."""
    out: dict[str, dict[str, Any]] = {}
    for cls, name in TORCHFT_CLASSES.items():
        values, notes = [], []
        for i in range(TORCHFT_REPEATS):
            try:
                found = torchft_recovery.cell(root / f"{cls}-{i}", name, None)["detection_s"]
            except (RuntimeError, OSError, ValueError, subprocess.TimeoutExpired) as exc:
                notes.append(f"torchft run failed: {exc}")
                continue
            if found is None:
                notes.append("the survivors formed no new quorum")
            else:
                values.append(found)
        entry = summary(values) if values else {"median_s": None}
        out[cls] = {**entry, "heartbeat_timeout_s": torchft_side.HEARTBEAT_TIMEOUT_S, "notes": notes}
    return out


def torchft_only() -> dict[str, Any]:
    """Measure the torchft entries alone into the last run's JSON (the other sides kept)."""
    path = ROOT / "docs" / "bench" / "detection.json"
    result: dict[str, Any] = json.loads(path.read_text())
    with tempfile.TemporaryDirectory(prefix="unicron-torchft-") as tmp:
        peer = torchft(Path(tmp))
    for cls in (*CLASSES, "node_loss", LONG):
        result[cls]["torchft"] = peer.get(cls)
    result["torchft_measured_apart"] = True  # not in the same run as the other two sides
    path.write_text(json.dumps(result, indent=2) + "\n")
    write_markdown(result)
    return result


def main() -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="unicron-detection-") as tmp:
        ours, mean, long_target = unicron(Path(tmp))
        theirs = torchrun(Path(tmp) / "torchrun")
        peer = torchft(Path(tmp) / "torchft")
    result: dict[str, Any] = {}
    for cls in (*CLASSES, "node_loss", LONG):
        entry: dict[str, Any] = {"unicron": ours.get(cls)}
        # torchrun measured with a tuned process-group timeout: with the default one (30 min
        # for gloo) a hang or a lost node would take half an hour per sample, so that column is
        # not measured and not shown (the template says what the default is).
        entry["torchrun_tuned"] = (
            {**theirs[cls], "process_group_timeout_s": TUNED_PG_TIMEOUT_S} if cls in theirs else None
        )
        entry["torchft"] = peer.get(cls)
        result[cls] = entry
    result["targets"] = {
        "exception_s": 1.0,
        "process_exit_s": 1.0,
        "node_loss_s": 3.0,
        "hang_s": round(3 * mean + HEARTBEAT_S, 3),
        "mean_iteration_s": round(mean, 4),
        f"{LONG}_s": round(long_target, 3),
        "hang_rule": "3 x mean iteration + one heartbeat",
    }
    (ROOT / "docs" / "bench").mkdir(parents=True, exist_ok=True)
    (ROOT / "docs" / "bench" / "detection.json").write_text(json.dumps(result, indent=2) + "\n")
    write_markdown(result)
    return result


def write_markdown(r: dict[str, Any]) -> None:
    t = r["targets"]
    rows = "\n".join(
        f"| {LABELS.get(cls, cls.replace('_', ' '))} | {cells.timing(r[cls]['unicron'])} | "
        f"{cells.timing(r[cls].get('torchrun_tuned'))} | {peer_cell(r[cls].get('torchft'))} |"
        for cls in (*CLASSES, "node_loss", LONG)
    )
    cut = [f"{row} {cells.NOT_MEASURED} |" for kind, row in cut_link_rows().items() if kind == "detection"]
    rows = "\n".join([rows, *cut])
    template = (Path(__file__).parent / "templates" / "detection.md").read_text()
    (ROOT / "docs" / "detection.md").write_text(
        template.format(
            rows=rows,
            repeats=REPEATS,
            hang_target=t["hang_s"],
            long_target=t[f"{LONG}_s"],
            pg=TUNED_PG_TIMEOUT_S,
            default_pg=DEFAULT_GLOO_TIMEOUT_S / 60,
            floor=BENCH_SETTINGS["hang_floor_s"],
            mean=t["mean_iteration_s"],
            long_verdict=long_verdict(r[LONG]["unicron"], t[f"{LONG}_s"]),
            ordering=ordering_markdown(),
            settings=settings_markdown(),
            torchft_heartbeat=torchft_side.HEARTBEAT_TIMEOUT_S,
            torchft_repeats=TORCHFT_REPEATS,
            torchft_version=TORCHFT_VERSION,
            torchft_when=(
                "measured in a run of its own (`python -m bench.detection_bench --torchft`), on the same "
                "machine, after the other two columns"
                if r.get("torchft_measured_apart")
                else "measured in the same run as the other two columns"
            ),
        )
    )


def long_verdict(measured: dict[str, Any] | None, target_s: float) -> str:
    """Whether the hangs on long iterations were found within their target, and why they land
    where they do: a step is judged late on the coordinator's tick once its deadline and one
    heartbeat (for its report to arrive) have passed, and the hang starts as its step starts."""
    if measured is None:
        return "the hang on long iterations was not measured."
    median, worst = measured["median_s"], measured["max_s"]
    if worst <= target_s:
        return f"detection is within the target (median {median:.2f} s, max {worst:.2f} s)."
    by = "at most one tick" if worst - target_s <= TICK_S else "more than a tick"
    return (
        f"detection misses the target by {by} of the coordinator's loop (a tick is {TICK_S:g} s): "
        f"the median is {median - target_s:+.2f} s from it, the max {worst - target_s:+.2f} s. The hang "
        "is injected as its step starts, so the whole deadline counts, and a step is judged late "
        "on the first tick after its deadline and one heartbeat (for its last report to arrive) "
        "have passed."
    )


def peer_cell(entry: dict[str, Any] | None) -> str:
    """A torchft latency: median / max, or why there is none."""
    if entry is None:
        return cells.NOT_MEASURED
    if entry.get("median_s") is None:
        return "; ".join(entry.get("notes") or ["no sample"])
    return cells.timing(entry)


def ordering_markdown() -> str:
    """The start-up ordering of timeouts, as ``Settings`` checks it."""
    lines = [f"    {low:<24}{'<=' if ok else '< '} {high:<26}({why})" for low, high, ok, why in ORDERING]
    return "\n".join(lines)


def settings_markdown() -> str:
    """Every setting's name, default and meaning, from ``Settings`` itself."""
    defaults = Settings()
    rows = [
        f"| `{name}` | {getattr(defaults, name):g} | {field.description or ''} |"
        for name, field in Settings.model_fields.items()
    ]
    return "\n".join(["| setting | default | meaning |", "|---|---|---|", *rows])


if __name__ == "__main__":
    if sys.argv[1:] == ["--docs"]:  # the page again from the last measured figures (a text change)
        write_markdown(json.loads((ROOT / "docs" / "bench" / "detection.json").read_text()))
    elif sys.argv[1:] == ["--torchft"]:  # the torchft column alone, into the last run's figures
        print(json.dumps(torchft_only(), indent=2))
    else:
        print(json.dumps(main(), indent=2))

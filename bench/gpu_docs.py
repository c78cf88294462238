"""docs/gpu.md from docs/bench/gpu.json and overhead-cpu.json (``python -m bench.gpu_bench DIR
--docs``: the checks in DIR's JSON, written on a GPU machine by ``bench.gpu_bench``, are merged
into them first, replacing the same checks of an earlier call on the same machine)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.overhead_verdict import MIN_PAIRS, TARGET, judged, spread

ROOT = Path(__file__).resolve().parents[1]
JSON, OUT = ROOT / "docs" / "bench" / "gpu.json", ROOT / "docs" / "gpu.md"
CPU_JSON = ROOT / "docs" / "bench" / "overhead-cpu.json"  # bench.gpu_bench's CPU cells, once run
# The checks bench.gpu_bench runs, in order, with what each one shows when it is missing.
SECTIONS = {
    "nccl": "the session's group code on NCCL",
    "recovery": "the world of one killed and restarted on the GPU",
    "overhead-tinygpt": "the tinygpt overhead cell on the GPU",
    "overhead-gpt-10m": "the gpt-10m overhead cell on the GPU (10.7M parameters)",
    "overhead-gpt-20m-fsdp": "the sharded example's model (~20M parameters) on the GPU, a world of one",
}


def write(source: Path | None = None) -> None:
    if source is not None:
        for target in (JSON, CPU_JSON):
            merge(source / target.name, target)
    OUT.write_text(render())


def merge(new: Path, target: Path) -> None:
    """``new``'s checks into ``target``'s. Results of a different machine or torch build are not
    mixed: ``target`` is then replaced whole."""
    if not new.is_file():
        return
    got = json.loads(new.read_text())
    kept = json.loads(target.read_text()) if target.is_file() else {}
    if kept and any(kept["machine"].get(k) != got["machine"].get(k) for k in ("gpu", "torch", "cpus")):
        kept = {}
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(kept | got, indent=2) + "\n")


def render() -> str:
    """docs/gpu.md as docs/bench/gpu.json says."""
    template = (Path(__file__).parent / "templates" / "gpu.md").read_text()
    return template.format(**fields(json.loads(JSON.read_text())))


def fields(r: dict[str, Any]) -> dict[str, Any]:
    m = r["machine"]
    nccl: dict[str, Any] = r["nccl"]["value"] if r.get("nccl", {}).get("ok") else {"checks": {}, "nccl": "?"}
    rec = r["recovery"]["value"] if r.get("recovery", {}).get("ok") else None
    rows = [
        row
        for name in SECTIONS
        if name.startswith("overhead") and r.get(name, {}).get("ok")
        for row in r[name]["value"]
    ]
    cpu = json.loads(CPU_JSON.read_text()) if CPU_JSON.is_file() else {"machine": {}}
    cells = cpu_cells() + side_cells()  # the side-by-side ones are run only when asked: no "not run" line
    cpu_rows = [row for name in cells if cpu.get(name, {}).get("ok") for row in cpu[name]["value"]]
    cpu_missing = [
        f"- Not run: the `{name}` overhead cell on the GPU machine's CPUs (`python -m bench.gpu_bench "
        f"DIR cpu --only {name}`): {why(cpu, name)}."
        for name in cpu_cells()
        if not cpu.get(name, {}).get("ok")
    ]
    missing = [
        f"- Not run: {what} (`{name}` has no result in docs/bench/gpu.json: {why(r, name)})."
        for name, what in SECTIONS.items()
        if not r.get(name, {}).get("ok")
    ]
    return {
        "gpu": m["gpu"],
        "gpu_memory": m["gpu_memory_gib"],
        "cpus": m["cpus"],
        "torch": m["torch"],
        "cuda": m["cuda"],
        "nccl": nccl.get("nccl", "?"),
        "python": m["python"],
        "nccl_seconds": r.get("nccl", {}).get("seconds", "-"),
        "nccl_verdict": "Every check held." if nccl.get("passed") else "NOT every check held (below).",
        "nccl_rows": "\n".join(
            f"| {name.replace('_', ' ')} | {'yes' if c['ok'] and c.get('value') is not False else 'NO'} |"
            for name, c in nccl["checks"].items()
        ),
        **recovery_fields(rec, r.get("recovery", {}).get("seconds", "-")),
        "overhead_rows": "\n".join(overhead_row(x) for x in rows),
        "overhead_note": overhead_note(rows),
        "cpu_rows": "\n".join(cpu_row(x) for x in cpu_rows) or "| (no cell ran) | | | | | | |",
        "cpu_note": cpu_note(cpu_rows),
        "cpu_cpus": cpu["machine"].get("cpus", "?"),
        "not_run": "\n".join(missing + cpu_missing),
    }


def cpu_cells() -> list[str]:
    from bench.gpu_bench import CPU_CELLS  # imports torch: only where docs are written

    return [f"{model}-{workers}" for model, workers in CPU_CELLS]


def side_cells() -> list[str]:
    from bench.gpu_bench import CPU_CELLS, SIDE, SIDE_MODELS

    return [f"{model}-{workers}{SIDE}" for model, workers in CPU_CELLS if model in SIDE_MODELS]


def recovery_fields(rec: dict[str, Any] | None, seconds: Any) -> dict[str, Any]:
    if rec is None:
        return dict.fromkeys(
            ("killed_at", "steps", "resumed", "launches", "param_diff", "optimizer_diff", "same_digest"), "-"
        ) | {"recovery_seconds": seconds}
    resumed = ", ".join(
        f"the {where.replace('_', '-')} copy of step {step}" for where, step in rec["resumed_from"]
    )
    return {
        "recovery_seconds": seconds,
        "killed_at": rec["killed_at_step"],
        "steps": rec["steps"][0],
        "resumed": resumed or "nothing (it did not resume)",
        "launches": rec["task_launches"],
        "param_diff": rec["max_abs_param_diff"],
        "optimizer_diff": rec["max_abs_optimizer_diff"],
        "same_digest": "yes" if rec["same_digest"] else "NO",
    }


def why(r: dict[str, Any], name: str) -> str:
    """Why a check has no result: its error, or (absent) the run ended before it finished."""
    if name in r:
        return str(r[name].get("error", "failed"))
    return "the device time ran out before this check ran"


def overhead_row(x: dict[str, Any]) -> str:
    times = f"{x['ddp_step_s'] * 1000:.1f} | {x['unicron_step_s'] * 1000:.1f} | {x['ratio']:.3f}"
    runs = f"{len(x['unicron_runs_s'])} a side, spread {spread(x) * 100:.0f}%"
    return f"| {x['model']} | {x['workers']} | {times} | {runs} |"


def overhead_note(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "No cell finished."
    noisy = max(spread(x) for x in rows)
    return (
        f"The runs of one side differ by up to {noisy * 100:.0f}%, far more than the 2% the overhead "
        "target asks to resolve, and at a world of one Unicron runs no collective while DDP reduces "
        "over its one rank. What it shows: the session's per-step work (membership check, position "
        "board, iteration report) on a GPU step is within the runs' noise of DDP's own. It is not a "
        "verdict on the target. The sharded example's model (`gpt-20m-fsdp`) is no overhead "
        "measure either: at a world of one torchrun's side still runs FSDP2 (a one-rank mesh: its "
        "all-gathers and reduce-scatters, and parameters re-gathered each step), while a Unicron "
        "task with replicas of one rank trains the model unsharded (`examples/fsdp/train.py`)."
    )


def cpu_row(x: dict[str, Any]) -> str:
    """A CPU cell, judged by its interval as docs/performance.md judges the 2-core machine's."""
    times = f"{x['ddp_step_s'] * 1000:.1f} | {x['unicron_step_s'] * 1000:.1f} | {x['ratio']:.3f}"
    j = judged(x["unicron_runs_s"], x["ddp_runs_s"])
    low, high = j["ratio_interval"]
    pinning = x.get("pinned")
    # Before a worker's hardware siblings were left idle, rows carried no "idle" list.
    pinned = "unpinned" if not pinning else "pinned" if "idle" in pinning else "pinned by core number"
    if x.get("side_by_side"):
        pinned = f"both sides at once, {'pinned' if pinning else 'unpinned'}"
    runs = f"{len(x['unicron_runs_s'])} a side, spread {spread(x) * 100:.0f}%, {pinned}"
    return f"| {x['model']} | {x['workers']} | {times} | {low:.3f} to {high:.3f}: {j['verdict']} | {runs} |"


def cpu_note(rows: list[dict[str, Any]]) -> str:
    """What the CPU cells show: each one's verdict where its interval gives one, and why the
    others give none (noise, too few runs, processes not pinned)."""
    if not rows:
        return "No cell ran."
    verdicts = {
        f"{x['model']} at {x['workers']}{' (both sides at once)' if x.get('side_by_side') else ''}": judged(
            x["unicron_runs_s"], x["ddp_runs_s"]
        )
        for x in rows
    }
    decided = [f"{cell} ({j['verdict']})" for cell, j in verdicts.items() if j["verdict"] != "unresolved"]
    pinned = sum(1 for x in rows if x.get("pinned"))
    how = (
        "Each worker ran on a core of its own, the launchers, coordinator and agent on the other "
        "cores (`bench/pinning.py`)."
        if pinned == len(rows)
        else "No cell was pinned: every process was free to move between cores."
        if pinned == 0
        else f"{pinned} of {len(rows)} cells were pinned (`bench/pinning.py`), the others not."
    )
    verdict = (
        f"Decided by their 95% intervals: {', '.join(decided)}."
        if decided
        else f"No cell's 95% interval decides the {TARGET} target (each straddles it, or the cell has "
        f"fewer than {MIN_PAIRS} runs a side)."
    )
    at_once = (
        ' Cells marked "both sides at once" ran each pair\'s two runs at the same time on disjoint '
        "cores, counting only the steps both ran meanwhile (`bench/side_by_side.py`): a drift of the "
        "machine's speed falls on both sides of a pair."
        if any(x.get("side_by_side") for x in rows)
        else ""
    )
    return (
        f"{verdict} Each cell is judged as docs/performance.md judges the 2-core machine's (its runs "
        f"resampled in their pairs).{at_once} {how} The runs of one side differ by up to "
        f"{max(spread(x) for x in rows) * 100:.0f}% (largest cell)."
    )

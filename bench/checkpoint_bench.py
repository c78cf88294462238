"""What periodic checkpoints cost a sharded task's steps: written before going on, or in the
background (``run.checkpoint_async``, ``src/unicron/train/backgroundsave.py``).

The sharded example (``examples/fsdp/train.py``, the overhead benchmark's ~19.5M-parameter GPT,
one replica of 2 ranks) runs as a Unicron task three ways, in the same run and alternating so
that drift of the machine falls on all three: no periodic checkpoint (only the final one, as
in the overhead benchmark), a checkpoint every ``EVERY`` steps written synchronously, and the
same written in the background. Every step's end is recorded by ``bench/steptimes.py``.

A checkpoint's cost to training is the extra time of the steps around it, so the figure is the
*mean* step interval after the warm-up (a median would pass over the checkpoint steps), and the
cost of one checkpoint is the mean's excess over the runs without checkpoints, times the
intervals, over the checkpoints in them. Writes docs/bench/checkpoint.json and
docs/checkpointing.md (``make bench``).
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench import overhead_bench
from bench.overhead_bench import ROOT, WARMUP, intervals

MODEL = "gpt-20m-hsdp"
WORKERS = 2  # one replica: the replica that writes the persistent tier is the whole task
ITERATIONS = 30
EVERY = 5  # steps between checkpoints (the default is 20; a short run needs several)
RUNS = 2  # per mode
MODES = {
    "none": "checkpoint_every: 100000",
    "synchronous": f"checkpoint_every: {EVERY}\n  checkpoint_async: false",
    "background": f"checkpoint_every: {EVERY}\n  checkpoint_async: true",
}


def checkpoints_within(steps: range) -> int:
    """The periodic checkpoints written at the end of ``steps`` (the final one is not: every
    mode writes it after the last step's time is taken)."""
    return sum(1 for step in steps if step % EVERY == 0 and step < ITERATIONS)


def run_once(root: Path, mode: str) -> dict[str, Any]:
    model = overhead_bench.MODELS[MODEL]
    overhead_bench.unicron(root, model, WORKERS, iterations=ITERATIONS, checkpoints=MODES[mode])
    times = intervals(root / "times")
    committed = sorted(p.name for p in (root / "cluster" / "checkpoints" / "overhead").glob("step-*.dcp"))
    return {"mean_step_s": statistics.fmean(times), "max_step_s": max(times), "committed": committed}


def main() -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    order = [mode for i in range(RUNS) for mode in (list(MODES), list(MODES)[::-1])[i % 2]]
    with tempfile.TemporaryDirectory(prefix="unicron-checkpoint-") as tmp:
        for i, mode in enumerate(order):
            runs[mode].append(run_once(Path(tmp) / f"{i}-{mode}", mode))
    # Step intervals after the warm-up: from the end of step WARMUP + 1 to the last step's end.
    measured = range(WARMUP + 2, ITERATIONS + 1)
    per_run = checkpoints_within(range(WARMUP + 1, ITERATIONS))
    mean = {mode: statistics.median(r["mean_step_s"] for r in rs) for mode, rs in runs.items()}
    cost = {
        mode: (mean[mode] - mean["none"]) * len(measured) / per_run for mode in ("synchronous", "background")
    }
    result = {
        "model": overhead_bench.MODELS[MODEL].described,
        "workers": WORKERS,
        "iterations": ITERATIONS,
        "checkpoint_every": EVERY,
        "warmup_steps": WARMUP,
        "runs_per_mode": RUNS,
        "checkpoints_measured_per_run": per_run,
        "mean_step_s": {mode: round(v, 5) for mode, v in mean.items()},
        "runs": {
            mode: [{**r, "mean_step_s": round(r["mean_step_s"], 5)} for r in rs] for mode, rs in runs.items()
        },
        "cost_per_checkpoint_s": {mode: round(v, 4) for mode, v in cost.items()},
        "background_over_synchronous": round(cost["background"] / cost["synchronous"], 3)
        if cost["synchronous"] > 0
        else None,
    }
    (ROOT / "docs" / "bench" / "checkpoint.json").write_text(json.dumps(result, indent=2) + "\n")
    write_markdown(result)
    return result


def write_markdown(r: dict[str, Any]) -> None:
    mean, cost = r["mean_step_s"], r["cost_per_checkpoint_s"]
    rows = "\n".join(
        f"| {mode} | {mean[mode] * 1000:.0f} | "
        + ("-" if mode == "none" else f"{cost[mode]:.2f}")
        + " | "
        + ", ".join(f"{x['mean_step_s'] * 1000:.0f}" for x in r["runs"][mode])
        + " |"
        for mode in MODES
    )
    ratio = r["background_over_synchronous"]
    verdict = (
        "the synchronous checkpoints cost nothing measurable here, so there was nothing to save"
        if ratio is None
        else f"a checkpoint written in the background costs the steps {ratio:.2f} of what the same "
        "checkpoint written before going on costs"
    )
    template = (Path(__file__).parent / "templates" / "checkpointing.md").read_text()
    (ROOT / "docs" / "checkpointing.md").write_text(
        template.format(
            rows=rows,
            verdict=verdict,
            model=r["model"],
            workers=r["workers"],
            iterations=r["iterations"],
            every=r["checkpoint_every"],
            warmup=r["warmup_steps"],
            runs=r["runs_per_mode"],
            per_run=r["checkpoints_measured_per_run"],
        )
    )


if __name__ == "__main__":
    # python -m bench.checkpoint_bench: measure; --docs: the page again from the last figures
    if sys.argv[1:] == ["--docs"]:
        write_markdown(json.loads((ROOT / "docs" / "bench" / "checkpoint.json").read_text()))
    else:
        print(json.dumps(main(), indent=2))

"""Failure-free overhead: the same script's step time under Unicron and under torchrun + DDP.

`examples/ddp-port/train_ddp.py` (DDP, DistributedSampler, DataLoader) runs under
`torch.distributed.run`; its port `train_unicron.py` runs as a Unicron task on an embedded
cluster (coordinator, one agent with one slot per worker, in-process recovery on: membership
checks, progress and iteration reports, overlapped gradient buckets). Same model, data, optimizer,
schedule, clipping and accumulation; one thread per worker on both sides; in the same run, the
two alternating (DDP, Unicron, Unicron, DDP) so that drift of the machine falls on both.

Sharded replicas (issue 14): `examples/fsdp/train_hsdp.py` (FSDP2 HSDP on a replicate x shard
mesh) under torchrun against `examples/fsdp/train.py` as a task with `run.replica_size: 2`
(FSDP2 inside each replica, Unicron's own sum across replicas), a ~19.5M-parameter GPT.

Step time: the median interval between consecutive `optimizer.step()` ends (recorded by
`bench/steptimes.py`, the same hook on both sides), over every worker, after a warm-up. The
port checkpoints only at the end, as the DDP script does. Models: the tinygpt example's default
size and a ~10.7M-parameter GPT (communication matters: ~43 MB of float32 gradients per step).
Writes docs/bench/overhead.json and docs/performance.md (run by `make bench`).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench import torchft_side
from bench.pinning import pinned
from bench.scale_bench import cpu_seconds
from bench.scraper import Scraper
from unicron.control.localcluster import LocalCluster

ROOT = Path(__file__).resolve().parents[1]
PORT, FSDP = ROOT / "examples" / "ddp-port", ROOT / "examples" / "fsdp"
TIMER = ROOT / "bench" / "steptimes.py"


@dataclass(frozen=True)
class Model:
    """One model's cells: the baseline script (torchrun) and its Unicron port, with their
    arguments; ``replica_size``: ranks per replica (the port's ``run.replica_size``)."""

    described: str
    args: tuple[str, ...]
    baseline: Path
    baseline_args: tuple[str, ...]
    port: Path
    port_args: tuple[str, ...]
    workers: tuple[int, ...]
    runs: int  # per side in each cell
    iterations: int
    replica_size: int = 1
    torchft: bool = False  # also run examples/torchft/train_torchft.py (same model and data)


GPT10M = ("--layers", "6", "--hidden", "384", "--heads", "6")
# The ddp-port scripts share their defaults; examples/fsdp/train.py takes tinygpt's (32 in 4s).
SAME_BATCH = ("--global-batch", "16", "--micro-batch", "2", "--dataset-size", "512")
MODELS = {
    # tinygpt's steps are short (tens of ms), where this shared machine's run-to-run noise weighs
    # most, and its runs are cheap: 9 runs a side, 200 steps (40 gave under a second of steady
    # state); gpt-10m's runs take ~1 min a triple (with torchft's): 9 a side, as 5 left its
    # 4-worker interval at 0.978-1.021, on the target's edge; the sharded GPT's steps take
    # seconds, with runs spread by ~6% (2 a side left its 2-worker cell at 1.058 within that
    # spread): 4 a side, too few for a verdict.
    "tinygpt": Model(
        "tinygpt default (2 layers, hidden 64)",
        (),
        PORT / "train_ddp.py",
        ("--checkpoint",),
        PORT / "train_unicron.py",
        ("--checkpoint",),
        (1, 2, 4),
        9,
        200,
        torchft=True,
    ),
    "gpt-10m": Model(
        "6 layers, hidden 384",
        GPT10M,
        PORT / "train_ddp.py",
        ("--checkpoint",),
        PORT / "train_unicron.py",
        ("--checkpoint",),
        (1, 2, 4),
        9,
        40,
        torchft=True,
    ),
    "gpt-20m-hsdp": Model(
        "8 layers, hidden 448, sequence 64, vocabulary 256; replicas of 2 ranks",
        SAME_BATCH,
        FSDP / "train_hsdp.py",
        ("--replica-size", "2"),
        FSDP / "train.py",
        (),
        (2, 4),
        4,
        24,
        replica_size=2,
        torchft=True,  # replica groups of 2 ranks: examples/torchft/train_torchft_hsdp.py
    ),
}
WARMUP = 8  # the first step intervals left out (start-up, first allocations)
TARGET = 1.02  # issues 12 and 14: Unicron / torchrun step time at most this
CONFIDENCE = 0.95  # of the interval a cell's ratio is judged by
DRAWS = 20_000  # bootstrap resamples per cell (seeded: the interval is a function of the runs)
# Fewer pairs than this leave a bootstrap too few distinct resamples to judge by (2 pairs: 3).
MIN_PAIRS = 5


def ratio_interval(ours: Sequence[float], theirs: Sequence[float]) -> tuple[float, float]:
    """A ``CONFIDENCE`` bootstrap interval of the ratio of the two sides' median step times.
    Run i of each side ran next to the other's (the alternating order), so the runs are drawn
    in pairs: a stretch when the machine was slow for both stays in both."""
    pairs = np.array(list(zip(ours, theirs, strict=True)))
    drawn = pairs[np.random.default_rng(0).integers(0, len(pairs), (DRAWS, len(pairs)))]
    ratios = np.median(drawn[:, :, 0], axis=1) / np.median(drawn[:, :, 1], axis=1)
    tail = (1 - CONFIDENCE) / 2
    low, high = np.quantile(ratios, [tail, 1 - tail])
    return float(low), float(high)


def judged(ours: Sequence[float], theirs: Sequence[float]) -> dict[str, Any]:
    """A cell's verdict on the target from its interval: met (the interval lies at or under
    it), missed (over it) or unresolved (it straddles the target, or the cell has fewer than
    ``MIN_PAIRS`` runs a side: more runs, or less noise)."""
    low, high = ratio_interval(ours, theirs)
    verdict = "met" if high <= TARGET else "missed" if low > TARGET else "unresolved"
    if len(ours) < MIN_PAIRS:
        verdict = "unresolved"
    return {"ratio_interval": [round(low, 4), round(high, 4)], "verdict": verdict}


TORCHFT_VERSION = "torchft-nightly 2026.10.26"  # the Makefile's pin


def intervals(folder: Path) -> list[float]:
    """The intervals between optimizer steps after the warm-up, pooled over every worker's record."""
    pooled: list[float] = []
    for path in folder.glob("steps-*.json"):
        ends = json.loads(path.read_text())[WARMUP:]
        pooled += [b - a for a, b in itertools.pairwise(ends)]
    if not pooled:
        raise RuntimeError(f"no step times were recorded in {folder}")
    return pooled


def step_seconds(folder: Path) -> float:
    """The median interval between optimizer steps, pooled over every worker's record."""
    return statistics.median(intervals(folder))


def with_paths(args: tuple[str, ...], path: Path) -> list[str]:
    """``args`` with a path after a flag that takes one (``--checkpoint``)."""
    return [a for arg in args for a in ((arg, str(path)) if arg == "--checkpoint" else (arg,))]


def ddp(root: Path, model: str | Model, workers: int) -> float:
    """The baseline under torchrun (DDP, or FSDP2 HSDP for a sharded model); on the GPU where
    the machine has one (the scripts take it)."""
    m, out = MODELS[model] if isinstance(model, str) else model, root / "times"
    out.mkdir(parents=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(workers)]
    cmd += [str(TIMER), str(out), str(m.baseline), *m.args, "--iterations", str(m.iterations)]
    cmd += with_paths(m.baseline_args, root / "ddp.pt")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with (root / "torchrun.log").open("wb") as log:
        subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, check=True, timeout=900)
    return step_seconds(out)


def unicron(
    root: Path,
    model: str | Model,
    workers: int,
    scraped: list[Scraper] | None = None,
    iterations: int = 0,
    gpus: list[str] | None = None,
    checkpoints: str = "checkpoint_every: 100000",
    control: list[float] | None = None,
) -> float:
    """The port as a Unicron task (``iterations``: other than the model's); ``scraped``: watched
    meanwhile by a ``Scraper`` (appended); ``gpus``: the agent's (``--gpus``), one per worker;
    ``checkpoints``: the task's checkpoint lines (by default only the final one is written);
    ``control``: the cores the control plane (coordinator and agent) used from the end of the
    warm-up to the task's end are appended to it."""
    m, out = MODELS[model] if isinstance(model, str) else model, root / "times"
    out.mkdir(parents=True)
    program = [
        "python",
        str(TIMER),
        str(out),
        str(m.port),
        *m.args,
        *with_paths(m.port_args, root / "unused"),
    ]
    spec = (
        f"name: overhead\nweight: 1\nthroughput: {{{workers}: 1.0e9}}\nmin_workers: {workers}\n"
        f"run:\n  program: {json.dumps(program)}\n  iterations: {iterations or m.iterations}\n"
        f"  {checkpoints}\n  replica_size: {m.replica_size}\n  env: {{OMP_NUM_THREADS: '1'}}\n"
    )
    with LocalCluster(root / "cluster", nodes=1, slots=workers, gpus=gpus) as cluster:
        watching = Scraper(cluster) if scraped is not None else contextlib.nullcontext()
        with watching:
            cluster.submit(spec)
            task = run_to_end(cluster, control)
        if isinstance(watching, Scraper) and scraped is not None:
            scraped.append(watching)
    if task["state"] != "finished":
        raise RuntimeError(f"the Unicron run of {model} at {workers} workers failed: {task['reason']}")
    return step_seconds(out)


def run_to_end(cluster: LocalCluster, control: list[float] | None) -> dict[str, Any]:
    """The submitted task once it ended; with ``control``, the cores the control plane
    (coordinator and agents) used from the end of the warm-up to the task's end are appended."""

    def ended() -> bool:
        return str(cluster.task("overhead")["state"]) in ("finished", "failed")

    def warm() -> bool:
        return int(cluster.task("overhead")["step"]) >= WARMUP or ended()

    plane = [p.pid for p in (cluster.coordinator, *cluster.agents.values()) if p is not None]
    if control is not None:
        cluster.wait(warm, 900, "the warm-up")
        used, since = sum(map(cpu_seconds, plane)), time.monotonic()
    cluster.wait(ended, 900, "the task to finish")
    if control is not None:
        control.append((sum(map(cpu_seconds, plane)) - used) / (time.monotonic() - since))
    return cluster.task("overhead")


def torchft(root: Path, model: str | Model, workers: int) -> float:
    """The peer: the same model and data under torchft, a replica group per replica (of one
    worker, or of ``replica_size`` ranks sharding the model: its HSDP form)."""
    m = MODELS[model] if isinstance(model, str) else model
    args = [*m.args, "--iterations", str(m.iterations)]
    return step_seconds(torchft_side.run_groups(root, workers // m.replica_size, args, ranks=m.replica_size))


def measure(
    root: Path,
    model: str,
    workers: int,
    m: Model | None = None,
    gpus: list[str] | None = None,
    pin: bool = False,
) -> dict[str, Any]:
    """One cell: ``model``'s (``m``: a model other than ``MODELS``'s, under that name) runs of
    both sides at ``workers``, alternating; ``gpus``: the Unicron agent's (a GPU machine);
    ``pin``: each worker on a core of its own and everything else on the other cores
    (``bench/pinning.py``), where the machine has cores enough (the row says)."""
    m = m or MODELS[model]
    sides = ("ddp", "unicron", "torchft") if m.torchft else ("ddp", "unicron")
    runs: dict[str, list[float]] = {side: [] for side in sides}
    control: list[float] = []  # the control plane's cores in each Unicron run
    order = [side for i in range(m.runs) for side in (sides, sides[::-1])[i % 2]]
    with pinned(workers) if pin else contextlib.nullcontext() as pinning:
        for i, side in enumerate(order):  # DDP, Unicron, Unicron, DDP, ...: drift falls on all
            where = root / f"{model}-{workers}-{i}-{side}"
            if side == "ddp":
                runs[side].append(ddp(where, m, workers))
            elif side == "torchft":
                runs[side].append(torchft(where, m, workers))
            else:
                runs[side].append(unicron(where, m, workers, gpus=gpus, control=control))
    # The median run: one run slowed by the machine (a neighbour's burst) does not move it.
    ours, theirs = statistics.median(runs["unicron"]), statistics.median(runs["ddp"])
    peer = {}
    if "torchft" in runs:
        ft = statistics.median(runs["torchft"])
        peer = {
            "torchft_step_s": round(ft, 5),
            "torchft_ratio": round(ft / theirs, 4),  # torchft / torchrun + DDP
            "torchft_runs_s": [round(x, 5) for x in runs["torchft"]],
        }
    return {
        "workers": workers,
        "model": model,
        "replica_size": m.replica_size,
        "unicron_step_s": round(ours, 5),
        "ddp_step_s": round(theirs, 5),
        "ratio": round(ours / theirs, 4),
        "unicron_runs_s": [round(x, 5) for x in runs["unicron"]],
        "ddp_runs_s": [round(x, 5) for x in runs["ddp"]],
        "control_plane_cores": round(statistics.median(control), 4),
        "pinned": pinning.as_json() if pinning is not None else None,
        **peer,
    }


def main(only: Sequence[str] = (), pin: bool = True) -> dict[str, Any]:
    """Measure every cell, or (``only``) those models' cells, keeping the other rows of the last
    run's JSON (each row's two sides are always measured in the same run); ``pin``: pinned
    cells where the cores suffice (``measure``)."""
    unknown = set(only) - set(MODELS)
    if unknown:
        raise SystemExit(f"unknown model(s) {sorted(unknown)}: choose among {sorted(MODELS)}")
    out = ROOT / "docs" / "bench" / "overhead.json"
    kept = [r for r in json.loads(out.read_text())["rows"] if r["model"] not in only] if only else []
    with tempfile.TemporaryDirectory(prefix="unicron-overhead-") as tmp:
        fresh = [
            measure(Path(tmp), model, workers, pin=pin)
            for model, m in MODELS.items()
            if not only or model in only
            for workers in m.workers
        ]
    order = list(MODELS)
    rows = sorted(kept + fresh, key=lambda r: (order.index(r["model"]), r["workers"]))
    result = summary(
        {
            "target_ratio": TARGET,
            "iterations": {name: m.iterations for name, m in MODELS.items()},
            "warmup_steps": WARMUP,
            "models": {name: m.described for name, m in MODELS.items()},
            "baselines": {name: f"torchrun + {m.baseline.relative_to(ROOT)}" for name, m in MODELS.items()},
            "runs_per_side": {name: m.runs for name, m in MODELS.items()},
            "rows": rows,
        }
    )
    (ROOT / "docs" / "bench").mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    write_markdown(result)
    return result


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """``result`` with every row judged from its runs, and the verdict over all rows: met only
    where every cell's interval lies at or under the target."""
    rows = [r | judged(r["unicron_runs_s"], r["ddp_runs_s"]) for r in result["rows"]]
    cells = {
        v: [f"{r['model']} at {r['workers']}" for r in rows if r["verdict"] == v]
        for v in ("missed", "unresolved")
    }
    return result | {
        "rows": rows,
        "confidence": CONFIDENCE,
        "met": all(r["verdict"] == "met" for r in rows),
        **cells,
    }


def spread(row: dict[str, Any]) -> float:
    """The cell's noise: how far apart the runs of one side are, the largest side's (max/min - 1)."""
    sides = [row[k] for k in ("unicron_runs_s", "ddp_runs_s", "torchft_runs_s") if k in row]
    return max(max(t) / min(t) - 1 for t in sides)


def table_row(x: dict[str, Any]) -> str:
    low, high = x["ratio_interval"]
    ours = (
        f"{x['ddp_step_s'] * 1000:.1f} | {x['unicron_step_s'] * 1000:.1f} | {x['ratio']:.3f} "
        f"| {low:.3f} to {high:.3f} | {x['verdict']}"
    )
    peer = (
        f"{x['torchft_step_s'] * 1000:.1f} | {x['torchft_ratio']:.3f}" if "torchft_step_s" in x else "- | -"
    )
    return f"| {x['model']} | {x['workers']} | {ours} | {peer} | {spread(x) * 100:.0f}% |"


def peer_summary(rows: list[dict[str, Any]]) -> str:
    """Where torchft's step is faster or slower than Unicron's, cell by cell."""
    cells = [x for x in rows if "torchft_step_s" in x]
    if not cells:
        return "not measured in this run."
    faster = [
        f"{x['model']} at {x['workers']} (by {(1 - x['torchft_step_s'] / x['unicron_step_s']) * 100:.1f}%, "
        f"within that cell's {spread(x) * 100:.0f}% spread between runs)"
        if 1 - x["torchft_step_s"] / x["unicron_step_s"] < spread(x)
        else f"{x['model']} at {x['workers']}"
        for x in cells
        if x["torchft_step_s"] < x["unicron_step_s"]
    ]
    worst = max(cells, key=lambda x: x["torchft_step_s"] / x["unicron_step_s"])
    slower = worst["torchft_step_s"] / worst["unicron_step_s"]
    wins = (
        f"torchft's step is faster in {', '.join(faster)}"
        if faster
        else "torchft's step is faster in no cell"
    )
    return (
        f"{wins}; at most {slower:.2f}x Unicron's ({worst['model']}, {worst['workers']} "
        f"worker{'s' if worst['workers'] > 1 else ''}). "
        "Both are compared with the same torchrun runs of the same cell (DDP; HSDP in the sharded rows)."
    )


def more_cores() -> str:
    """What the same cells gave with fewer workers than cores (``bench.gpu_bench``'s CPU cells
    on a lent machine, docs/bench/overhead-cpu.json), if they were run."""
    path = ROOT / "docs" / "bench" / "overhead-cpu.json"
    if not path.is_file():
        return ""
    measured = json.loads(path.read_text())
    rows = [row for entry in measured.values() if entry.get("ok") for row in entry["value"]]
    if not rows:
        return ""
    cores = measured["machine"]["cpus"]
    if any(x.get("pinned") for x in rows):  # bench.gpu_bench's cells are pinned since 4eeffb1
        verdicts = ", ".join(
            f"{x['model']} at {x['workers']}: {judged(x['unicron_runs_s'], x['ddp_runs_s'])['verdict']}"
            for x in rows
        )
        return (
            f" On a lent machine's {cores} cores, pinned (docs/gpu.md, {len(rows)} of these cells, "
            f"judged the same way): {verdicts}."
        )
    ratios = sorted(x["ratio"] for x in rows)
    return (
        f" Fewer workers than cores alone did not settle it: on a lent machine's "
        f"{cores} cores (docs/gpu.md, {len(rows)} of these cells, unpinned) "
        f"the same side's runs differed by up to {max(spread(x) for x in rows) * 100:.0f}% and the "
        f"ratios ranged from {ratios[0]:.3f} to {ratios[-1]:.3f}."
    )


def pinned_text(rows: list[dict[str, Any]]) -> str:
    """Which cells ran pinned (``bench/pinning.py``), and which can be here."""
    pinned = [f"{x['model']} at {x['workers']}" for x in rows if x.get("pinned")]
    fits = sorted({x["workers"] for x in rows if x["workers"] + 1 <= (os.cpu_count() or 1)})
    sizes = " or ".join(map(str, fits))
    where = f"cells of {sizes} worker{'s' if fits and fits[-1] > 1 else ''}" if fits else "no cell"
    how = (
        "each worker on a core of its own, the launchers, coordinator, agent and lighthouse on the "
        f"other cores; it needs a core more than the cell has workers: here, {where}"
    )
    if not pinned:
        return f"No cell was pinned (`bench/pinning.py`: {how})."
    others = "The others' processes were free to move between cores."
    return f"Pinned cells (`bench/pinning.py`: {how}): {', '.join(pinned)}. {others}"


def control_text(rows: list[dict[str, Any]]) -> str:
    """What the control plane's CPU costs the workers, from the cells where it was measured."""
    cells = [x for x in rows if "control_plane_cores" in x]
    if not cells:
        return "not measured in this run."
    cores = [x["control_plane_cores"] for x in cells]
    share = max(cores) / (os.cpu_count() or 1)
    return (
        f"the coordinator and the agent together used {min(cores):.3f} to {max(cores):.3f} cores from the "
        f"end of the warm-up to the task's end ({', '.join(sorted({x['model'] for x in cells}))} cells, the "
        f"median of each cell's runs), up to {share * 100:.1f}% of this machine's {os.cpu_count()} cores. "
        "Where the workers fill every core (2 and 4 workers here) that CPU comes out of theirs. "
        "torchrun's own agent (it polls its workers every 0.1 s by default) is not measured. On a GPU "
        "host, whose cores the workers leave mostly idle, it would not be taken from training."
    )


def verdict_text(r: dict[str, Any]) -> str:
    """The verdict over every cell, in words."""
    if r["met"]:
        return "met at every size (every cell's interval lies at or under it)"
    parts = []
    if r["missed"]:
        parts.append(f"missed in {', '.join(r['missed'])} (the interval lies above it)")
    if r["unresolved"]:
        parts.append(
            f"unresolved in {', '.join(r['unresolved'])} (the interval straddles it, or the cell has "
            f"fewer than {MIN_PAIRS} runs a side: these runs cannot tell)"
        )
    return "NOT shown to be met: " + "; ".join(parts)


def write_markdown(r: dict[str, Any]) -> None:
    rows = "\n".join(table_row(x) for x in r["rows"])
    worst = max(r["rows"], key=lambda x: x["ratio"])
    noisiest = max(spread(x) for x in r["rows"])
    noise = (
        (
            "more than the 2% the target asks to resolve: this shared 2-core machine cannot show whether "
            "the target is met in the noisier cells. Fewer workers than cores, pinned, and more runs are "
            "what a verdict needs."
            if noisiest > TARGET - 1
            else "within the 2% the target asks to resolve."
        )
        + more_cores()
        + " "
        + pinned_text(r["rows"])
    )
    template = (Path(__file__).parent / "templates" / "performance.md").read_text()
    (ROOT / "docs" / "performance.md").write_text(
        template.format(
            rows=rows,
            target=f"{r['target_ratio']:.2f}",
            verdict=verdict_text(r),
            worst=f"{worst['ratio']:.3f} ({worst['model']}, {worst['workers']} workers)",
            spread=f"{noisiest * 100:.0f}%",
            confidence=f"{r['confidence'] * 100:.0f}%",
            noise=noise,
            tiny_steps=r["iterations"]["tinygpt"],
            big_steps=r["iterations"]["gpt-10m"],
            warmup=r["warmup_steps"],
            tiny=r["models"]["tinygpt"],
            big=r["models"]["gpt-10m"],
            tiny_runs=r["runs_per_side"]["tinygpt"],
            big_runs=r["runs_per_side"]["gpt-10m"],
            sharded=r["models"]["gpt-20m-hsdp"],
            sharded_steps=r["iterations"]["gpt-20m-hsdp"],
            sharded_runs=r["runs_per_side"]["gpt-20m-hsdp"],
            torchft_version=TORCHFT_VERSION,
            peer=peer_summary(r["rows"]),
            control=control_text(r["rows"]),
        )
    )


if __name__ == "__main__":
    # python -m bench.overhead_bench [--unpinned] [MODEL ...]: every model, or only those, each
    # worker on a core of its own where the cores suffice (--unpinned: free to move); --docs: the
    # page again from the last measured figures (a text change)
    if sys.argv[1:] == ["--docs"]:  # the verdicts are a function of the runs: judged again
        path = ROOT / "docs" / "bench" / "overhead.json"
        judged_again = summary(json.loads(path.read_text()))
        path.write_text(json.dumps(judged_again, indent=2) + "\n")
        write_markdown(judged_again)
    else:
        named = [a for a in sys.argv[1:] if a != "--unpinned"]
        print(json.dumps(main(named, pin="--unpinned" not in sys.argv[1:]), indent=2))

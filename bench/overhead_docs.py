"""docs/performance.md from the overhead benchmark's figures (``bench/overhead_bench.py``; the
verdicts from ``bench/overhead_verdict.py``)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from bench.overhead_verdict import MIN_PAIRS, TARGET, judged, spread
from bench.pinning import plan, threads
from bench.sections import kept_sections

ROOT = Path(__file__).resolve().parents[1]
TORCHFT_VERSION = "torchft-nightly 2026.10.26"  # the Makefile's pin


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


def more_cores(path: Path = ROOT / "docs" / "bench" / "overhead-cpu.json") -> str:
    """What the same cells gave with fewer workers than cores (``bench.gpu_bench``'s CPU cells
    on a lent machine, docs/bench/overhead-cpu.json), if they were run."""
    if not path.is_file():
        return ""
    measured = json.loads(path.read_text())
    rows = [row for entry in measured.values() if entry.get("ok") for row in entry["value"]]
    if not rows:
        return ""
    cores = measured["machine"]["cpus"]
    pinned = [x for x in rows if x.get("pinned")]  # bench.gpu_bench's cells are pinned since 4eeffb1
    unpinned = [x for x in rows if not x.get("pinned")]
    parts = []
    if pinned:
        verdicts = ", ".join(
            f"{x['model']} at {x['workers']}{' (both sides at once)' if x.get('side_by_side') else ''}: "
            f"{judged(x['unicron_runs_s'], x['ddp_runs_s'])['verdict']}"
            for x in pinned
        )
        # Rows pinned before a worker's hardware siblings were left idle carry no "idle" list.
        by_number = sum(1 for x in pinned if not x.get("side_by_side") and "idle" not in x["pinned"])
        how = f" ({by_number} by core number only: a worker's hardware siblings may have been busy)"
        parts.append(
            f"pinned, {len(pinned)} of these cells (judged the same way): {verdicts}; the same side's "
            f"runs differed by up to {max(spread(x) for x in pinned) * 100:.0f}%{how if by_number else ''}"
        )
    if unpinned:
        ratios = sorted(x["ratio"] for x in unpinned)
        ratio = (
            f"the ratios ranged from {ratios[0]:.3f} to {ratios[-1]:.3f}"
            if len(ratios) > 1
            else f"the ratio was {ratios[0]:.3f}"
        )
        parts.append(
            f"unpinned, {len(unpinned)} cell{'s' if len(unpinned) > 1 else ''}: runs differed by up to "
            f"{max(spread(x) for x in unpinned) * 100:.0f}% and {ratio}"
        )
    return f" On a lent machine's {cores} cores (docs/gpu.md): {'; '.join(parts)}."


def pinned_text(rows: list[dict[str, Any]]) -> str:
    """Which cells ran pinned (``bench/pinning.py``), and which can be here."""
    pinned = [f"{x['model']} at {x['workers']}" for x in rows if x.get("pinned")]
    cores = os.sched_getaffinity(0)
    fits = sorted({x["workers"] for x in rows if plan(threads(cores), x["workers"]) is not None})
    sizes = " or ".join(map(str, fits))
    where = f"cells of {sizes} worker{'s' if fits and fits[-1] > 1 else ''}" if fits else "no cell"
    how = (
        "each worker on a physical core of its own, its other hardware threads idle, the "
        "launchers, coordinator, agent and lighthouse on the other cores; it needs a physical "
        f"core more than the cell has workers: here, {where}"
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


def runs_text(rows: list[dict[str, Any]], model: str) -> str:
    """How many runs a side the model's rows hold: one number where they agree, else the most
    common with the others by worker count (a cell measured again with more runs)."""
    counts = {r["workers"]: len(r["unicron_runs_s"]) for r in rows if r["model"] == model}
    if not counts:
        return "no"
    most = max(set(counts.values()), key=lambda n: (list(counts.values()).count(n), n))
    others = [f"{n} at {w} worker{'s' if w > 1 else ''}" for w, n in sorted(counts.items()) if n != most]
    return f"{most} ({', '.join(others)})" if others else str(most)


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
            "the target is met in the noisier cells."
            if noisiest > TARGET - 1
            else "within the 2% the target asks to resolve."
        )
        + more_cores()
        + " "
        + pinned_text(r["rows"])
    )
    template = (Path(__file__).parent / "templates" / "performance.md").read_text()
    page = ROOT / "docs" / "performance.md"
    page.write_text(
        kept_sections(
            page,
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
                tiny_runs=runs_text(r["rows"], "tinygpt"),
                big_runs=runs_text(r["rows"], "gpt-10m"),
                sharded=r["models"]["gpt-20m-hsdp"],
                sharded_steps=r["iterations"]["gpt-20m-hsdp"],
                sharded_runs=runs_text(r["rows"], "gpt-20m-hsdp"),
                llama=r["models"]["hf-llama"],
                llama_steps=r["iterations"]["hf-llama"],
                llama_runs=runs_text(r["rows"], "hf-llama"),
                torchft_version=TORCHFT_VERSION,
                peer=peer_summary(r["rows"]),
                control=control_text(r["rows"]),
            ),
            SECTIONS,
        )
    )


# Sections other benchmarks write into the page after it (``bench/decide_bench.py``,
# ``bench/numerical_bench.py``): a rewrite of the page alone keeps what they measured.
SECTIONS = ("decide_bench", "numerical_bench")

"""Where Unicron pays off (issue 57, point 4): Unicron against Megatron restart, torchft and the
oracle over node MTBF, cluster size and number of tasks.

Each cell of the grid is a generated scenario (``cell_scenario``): a cluster of ``gpus`` GPUs in
nodes of 8 A100s, the first ``tasks`` tasks of ``POOL`` (GPT-3 shapes of 1.3B to 13B, weights 1 to
2, as in examples/scenarios/trace-b.yaml; each task's global batch one sequence per GPU of the
cluster, at least 512, so that one task alone can use all of it), failing at the cell's node MTBF
with Alibaba's termination mix (the paper's Figure 1) and log-normal repairs (median 4 h), for as
many days as give about ``TARGET_FAILURES`` failures (at least ``MIN_DAYS``, at most
``MAX_DAYS``). The policies are the CLI's, with their settings as the CLI has them (torchft's
measured costs, ``sim/measured.py``). Beside the grid, one cell per size and task count at the
rate published for a job of the cluster's size (``sim/interruptions.py``).

Writes docs/bench/sweep.json, docs/sim-sweep.png and its section of docs/simulation.md (``make
bench``; ``python -m bench.sweep_bench [--quick]``).
"""

from __future__ import annotations

import argparse
import json
import textwrap
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.sections import write_section
from bench.simulation_docs import PAPER
from unicron.core.extras import require
from unicron.sim import interruptions
from unicron.sim.policies import MegatronSettings
from unicron.sim.runner import SimulationReport, simulate
from unicron.sim.scenario import ScenarioSpec

ROOT = Path(__file__).resolve().parents[1]
MTBF_HOURS = (10, 30, 100, 300, 1000, 3000, 10000)  # each node's mean hours between failures
GPUS = (128, 1024, 16384)  # the cluster (issue 57: 128 to 16,384 GPUs)
TASK_COUNTS = (1, 2, 4, 8)  # tasks sharing it (issue 57: 1 to 8)
QUICK = {"mtbf": (10, 1000), "gpus": (128,), "tasks": (1, 4)}  # ``--quick``: a few cells, seconds
GPUS_PER_NODE = 8
BASELINES = ("megatron", "torchft")
TARGET_FAILURES = 200  # a cell lasts long enough for about this many failures...
# A task grows and shrinks by a node, or by this share of a larger cluster (128 GPUs at 16,384: as
# examples/scenarios/llama3.yaml's model copy), so that a plan weighs at most this many sizes a task.
UNITS = 128
MIN_DAYS, MAX_DAYS = 0.25, 60.0  # ... within these bounds (a day at 10 h and 2,048 nodes is 4,915)
# (name, weight, model, min_workers): trace-b's four GPT-3 sizes, then the four again with their
# weights turned round, so that 8 tasks are 8 distinct (name, weight) pairs.
SHAPES = {
    "1.3b": ({"layers": 24, "hidden_size": 2048, "heads": 16}, 8),
    "2.7b": ({"layers": 32, "hidden_size": 2560, "heads": 32}, 8),
    "6.7b": ({"layers": 32, "hidden_size": 4096, "heads": 32}, 16),
    "13b": ({"layers": 40, "hidden_size": 5120, "heads": 40}, 32),
}
POOL = (
    ("6.7b", 1.5),
    ("13b", 2.0),
    ("2.7b", 1.2),
    ("1.3b", 1.0),
    ("6.7b", 1.0),
    ("13b", 1.2),
    ("2.7b", 2.0),
    ("1.3b", 1.5),
)


@dataclass(frozen=True)
class Cell:
    """One point of the sweep: each node's MTBF, the cluster's GPUs, the tasks sharing it."""

    mtbf_hours: float
    gpus: int
    tasks: int
    published: bool = False  # the MTBF is the one published for a job of the cluster's size

    @property
    def nodes(self) -> int:
        return self.gpus // GPUS_PER_NODE

    @property
    def days(self) -> float:
        """Long enough for about ``TARGET_FAILURES`` failures, within the bounds."""
        wanted = TARGET_FAILURES * self.mtbf_hours / (self.nodes * 24)
        return round(min(MAX_DAYS, max(MIN_DAYS, wanted)), 3)

    @property
    def seed(self) -> int:
        """A seed of the cell's own, the same on every run."""
        return self.gpus * 7 + self.tasks * 131 + round(self.mtbf_hours)


def cell_scenario(cell: Cell) -> ScenarioSpec:
    """The cell as a scenario, validated as a scenario file is."""
    batch = max(512, cell.gpus)
    step = max(GPUS_PER_NODE, cell.gpus // UNITS)
    tasks = []
    for i, (shape, weight) in enumerate(POOL[: cell.tasks]):
        model, least = SHAPES[shape]
        tasks.append(
            {
                "name": f"gpt3-{shape}-{i}",
                "weight": weight,
                "model": {**model, "sequence_length": 2048, "vocabulary": 51200, "global_batch": batch},
                "min_workers": max(least, step),
                "worker_step": step,
            }
        )
    return ScenarioSpec.model_validate(
        {
            "name": f"sweep-{cell.mtbf_hours:g}h-{cell.gpus}gpu-{cell.tasks}t",
            "days": cell.days,
            "cluster": {
                "nodes": cell.nodes,
                "gpus_per_node": GPUS_PER_NODE,
                "gpu": "A100",
                "node_mtbf_hours": cell.mtbf_hours,
            },
            "tasks": tasks,
            "trace": {"mix": "unicron", "repair_median_hours": 4, "seed": cell.seed},
            "policies": ["unicron", *BASELINES],
            "samples": 50,
        }
    )


def run_cell(cell: Cell) -> dict[str, Any]:
    """Simulate the cell: each policy's share of the oracle, Unicron's lead over each baseline."""
    report: SimulationReport = simulate(cell_scenario(cell))
    share = {r.policy: r.ratio_to_oracle for r in report.results}
    unicron = report.result("unicron").waf_flop
    ahead = {}
    for name in BASELINES:
        theirs = report.result(name).waf_flop
        ahead[name] = unicron / theirs if theirs > 0 else None  # None: the baseline achieved nothing
    return {
        "mtbf_hours": cell.mtbf_hours,
        "gpus": cell.gpus,
        "tasks": cell.tasks,
        "published_rate": cell.published,
        "days": cell.days,
        "failures": len(report.failures),
        "of_oracle": share,
        "unicron_over": ahead,
        "simulate_s": round(report.seconds, 3),
    }


def published_cells(sizes: tuple[int, ...], counts: tuple[int, ...]) -> list[Cell]:
    """Per size and task count: each node failing at the rate that interrupts a job on the whole
    cluster as often as published figures say a job that large is."""
    return [
        Cell(round(interruptions.node_mtbf_hours(g // GPUS_PER_NODE, GPUS_PER_NODE), 1), g, k, published=True)
        for g in sizes
        for k in counts
    ]


def measure(quick: bool = False) -> dict[str, Any]:
    """Every cell of the grid, then the published rates' cells."""
    if quick:
        mtbfs, sizes, counts = QUICK["mtbf"], QUICK["gpus"], QUICK["tasks"]
    else:
        mtbfs, sizes, counts = MTBF_HOURS, GPUS, TASK_COUNTS
    cells = [Cell(m, g, k) for g in sizes for k in counts for m in mtbfs] + published_cells(sizes, counts)
    started, rows = time.perf_counter(), []
    for cell in cells:
        rows.append(run_cell(cell))
        shown = ("mtbf_hours", "gpus", "tasks", "failures", "unicron_over", "simulate_s")
        print(json.dumps({k: rows[-1][k] for k in shown}), flush=True)
    return {
        "grid": {"mtbf_hours": list(mtbfs), "gpus": list(sizes), "tasks": list(counts)},
        "gpus_per_node": GPUS_PER_NODE,
        "target_failures": TARGET_FAILURES,
        "days_bounds": [MIN_DAYS, MAX_DAYS],
        "rows": rows,
        "seconds": round(time.perf_counter() - started, 1),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def ratio_text(value: float | None) -> str:
    """Unicron's lead as the tables show it; "-" where the baseline achieved nothing."""
    if value is None:
        return "-"
    return f"{value:,.0f}x" if value >= 100 else f"{value:.2f}x"


def lookup(rows: list[dict[str, Any]], gpus: int, tasks: int, mtbf: float | None) -> dict[str, Any]:
    """The row of a cell (``mtbf`` None: the published rate's)."""
    return next(
        r
        for r in rows
        if r["gpus"] == gpus
        and r["tasks"] == tasks
        and (r["published_rate"] if mtbf is None else not r["published_rate"] and r["mtbf_hours"] == mtbf)
    )


def grid_table(r: dict[str, Any]) -> str:
    """Per cluster size and task count (rows) and node MTBF (columns): Unicron over Megatron
    restart, over torchft, and its share of the oracle."""
    grid = r["grid"]
    head = ["GPUs", "tasks", *(f"MTBF {m:,} h" for m in grid["mtbf_hours"]), "published rate"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for gpus in grid["gpus"]:
        for tasks in grid["tasks"]:
            cells = []
            for mtbf in [*grid["mtbf_hours"], None]:
                row = lookup(r["rows"], gpus, tasks, mtbf)
                ahead = row["unicron_over"]
                where = f" at {row['mtbf_hours']:,.0f} h" if mtbf is None else ""
                share = row["of_oracle"]["unicron"]
                cells.append(
                    f"{ratio_text(ahead['megatron'])} / {ratio_text(ahead['torchft'])} / "
                    f"{share * 100:.1f}%{where}"
                )
            lines.append(f"| {gpus:,} | {tasks} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def paper_regime(r: dict[str, Any], low: float, high: float) -> str:
    """The cells whose lead over Megatron restart lies within the paper's range."""
    found = [
        row
        for row in r["rows"]
        if row["unicron_over"]["megatron"] is not None
        and low <= round(row["unicron_over"]["megatron"], 2) <= high  # (as the table shows it)
    ]
    if not found:
        return "no cell of the grid"
    return "; ".join(
        f"{row['gpus']:,} GPUs, {row['tasks']} task{'s' if row['tasks'] > 1 else ''}, node MTBF "
        f"{row['mtbf_hours']:,.0f} h{' (published rate)' if row['published_rate'] else ''}: "
        f"{ratio_text(row['unicron_over']['megatron'])}"
        for row in found
    )


def plot(r: dict[str, Any], path: Path, paper: tuple[float, float]) -> None:
    """One panel per cluster size: Unicron over Megatron restart (solid) and over torchft
    (dashed) against node MTBF, a line per task count; the paper's range shaded; the published
    rate's MTBF dotted."""
    matplotlib = require("matplotlib", "plot", "a plot")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    grid = r["grid"]
    fig, axes = plt.subplots(1, len(grid["gpus"]), figsize=(4.6 * len(grid["gpus"]), 4.2), squeeze=False)
    for ax, gpus in zip(axes[0], grid["gpus"], strict=True):
        for i, tasks in enumerate(grid["tasks"]):
            rows = [lookup(r["rows"], gpus, tasks, m) for m in grid["mtbf_hours"]]
            for baseline, style in (("megatron", "-"), ("torchft", "--")):
                xs = [row["mtbf_hours"] for row in rows if row["unicron_over"][baseline] is not None]
                ys = [
                    row["unicron_over"][baseline] for row in rows if row["unicron_over"][baseline] is not None
                ]
                label = f"{tasks} task{'s' if tasks > 1 else ''}, over {baseline}"
                ax.plot(xs, ys, style, color=f"C{i}", marker="o", markersize=3, label=label)
        published = lookup(r["rows"], gpus, grid["tasks"][0], None)["mtbf_hours"]
        ax.axvline(published, color="black", linestyle=":", linewidth=1)
        ax.axhspan(*paper, color="grey", alpha=0.2)
        ax.set(xscale="log", yscale="log", xlabel="node MTBF (hours)", title=f"{gpus:,} GPUs")
        low, high = ax.get_ylim()
        ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}x"))  # (not 1 x 10^0)
        narrow = high / low < 20  # (a wide range's minor ticks crowd: only its decades are named)
        ax.yaxis.set_minor_formatter(
            ticker.FuncFormatter(lambda v, _: f"{v:g}x") if narrow else ticker.NullFormatter()
        )
    axes[0][0].set_ylabel("Unicron's WAF over the baseline's")
    axes[0][-1].legend(fontsize=6, loc="upper right")
    fig.suptitle("Where Unicron pays off (grey: the paper's range over Megatron; dotted: the published rate)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def paper_range() -> tuple[float, float]:
    """Unicron over Megatron-LM as the paper reports it, lowest and highest (``simulation_docs``)."""
    values = [float(PAPER[name]["megatron"].rstrip("x")) for name in PAPER]
    return min(values), max(values)


def published_text(r: dict[str, Any]) -> str:
    """Per cluster size, the published rate's MTBF and the leads there, fewest to most tasks."""
    parts = []
    for gpus in r["grid"]["gpus"]:
        rows = [lookup(r["rows"], gpus, k, None) for k in r["grid"]["tasks"]]
        leads = ", ".join(ratio_text(row["unicron_over"]["megatron"]) for row in rows)
        over_ft = ", ".join(ratio_text(row["unicron_over"]["torchft"]) for row in rows)
        parts.append(
            f"{gpus:,} GPUs (each node's MTBF {rows[0]['mtbf_hours']:,.0f} h): over Megatron restart "
            f"{leads}, over torchft {over_ft}"
        )
    counts = ", ".join(str(k) for k in r["grid"]["tasks"])
    return f"for {counts} tasks, " + "; ".join(parts)


def stalled_text(r: dict[str, Any]) -> str:
    """The cells where Megatron restart hardly ran, and why their leads are so large."""
    stalled = [row for row in r["rows"] if (row["unicron_over"]["megatron"] or 0.0) > 10]
    restart = MegatronSettings()
    minutes = (restart.resubmit_s + restart.setup_s) / 60
    if not stalled:
        return "In no cell is the lead over Megatron restart above 10x."
    kept = max(row["of_oracle"]["megatron"] for row in stalled)
    return (
        f"In {len(stalled)} cells the lead over Megatron restart is above 10x: there it kept "
        f"{kept * 100:.1f}% of the oracle's WAF at most, each of its restarts ({minutes:g} min of "
        "resubmission and set-up after the failure's detection) taking most of the time between its "
        "tasks' failures; such a lead is a ratio to a small number, and varies from cell to cell."
    )


def section(r: dict[str, Any]) -> str:
    """The sweep's section of docs/simulation.md (between the page's markers)."""
    low, high = paper_range()
    longest = max(r["rows"], key=lambda row: row["simulate_s"])
    intro = (
        f"Measured by `bench/sweep_bench.py` (`make bench`) on {r['date'][:10]}; every cell in "
        f"`docs/bench/sweep.json`. Each cell is a generated scenario: a cluster of that many GPUs "
        f"(nodes of {r['gpus_per_node']} A100s) shared by the first tasks of eight GPT-3 tasks (1.3B "
        "to 13B parameters, weights 1 to 2, as in trace-b; each task's global batch one sequence per "
        "GPU of the cluster, at least 512, so that one task alone can use all of it; a task grows and "
        f"shrinks by a node, or by 1/{UNITS} of a larger cluster), each node failing at the column's "
        "MTBF with Alibaba's termination mix (the paper's Figure 1) and log-normal repairs (median "
        f"4 h), for as long as gives about {r['target_failures']} failures (within "
        f"{r['days_bounds'][0]:g} to {r['days_bounds'][1]:g} days; at high rates on large clusters "
        "the floor gives more). The policies run with the CLI's settings (`unicron simulate`), "
        "torchft's costs as measured. A cell: Unicron's WAF over Megatron restart's / over torchft's "
        "(\"-\": the baseline achieved nothing) / Unicron's share of the oracle's. The last column: "
        "each node failing at the rate that gives a job on the whole cluster the published "
        "interruption rate (the table at the top)."
    )
    notes = [
        f"The paper's range over Megatron-LM ({low:g}x to {high:g}x) is reached at: "
        f"{paper_regime(r, low, high)}.",
        f"At the published failure rates, {published_text(r)}.",
        stalled_text(r),
        "Of the paper's conditions, these are known: a 128-GPU cluster, GPT-3-style models trained "
        "with Megatron-LM, Megatron-LM restarting from checkpoints, failure traces from Alibaba's "
        "platform with the kinds of its Figure 1, and several tasks sharing the cluster. Not known "
        "here: the traces' failure rates and repair times (trace-a and trace-b are reconstructions), "
        "the tasks' sizes and weights, Megatron-LM's restart cost and checkpoint interval in its runs "
        "(ours: the breakdown in docs/design.md and an assumed 30 min), and whether its jobs waited "
        "for repairs or restarted on fewer nodes (ours restart on fewer, `on_node_loss: shrink`).",
        f"{len(r['rows'])} cells in {r['seconds']:,.0f} s on this machine, in one run (a time, not a "
        "target: the cells' figures are the simulation's, the same on every run; the longest, "
        f"{longest['gpus']:,} GPUs, {longest['tasks']} tasks, MTBF {longest['mtbf_hours']:,.0f} h, "
        f"{longest['failures']:,} failures: {longest['simulate_s']:,.0f} s).",
    ]
    bullets = "\n".join(textwrap.fill(n, 98, initial_indent="- ", subsequent_indent="  ") for n in notes)
    figure = "![sweep](sim-sweep.png)"
    return f"{figure}\n\n{textwrap.fill(intro, 98)}\n\n{grid_table(r)}\n\n{bullets}\n"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Measure, write docs/bench/sweep.json, the plot and the page's section; return the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a few small cells (no docs written)")
    ap.add_argument("--docs-only", action="store_true", help="rewrite the plot and section from the JSON")
    args = ap.parse_args(argv)
    out = ROOT / "docs" / "bench" / "sweep.json"
    if args.docs_only:
        r: dict[str, Any] = json.loads(out.read_text())
    else:
        r = measure(quick=args.quick)
        if args.quick:
            return r
        out.write_text(json.dumps(r, indent=1) + "\n")
    plot(r, ROOT / "docs" / "sim-sweep.png", paper_range())
    write_section(section(r), "sweep_bench", "Where Unicron pays off", ROOT / "docs" / "simulation.md")
    return r


if __name__ == "__main__":
    main()

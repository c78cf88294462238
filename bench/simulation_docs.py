"""Run the shipped scenarios; write docs/simulation.md, its plots and docs/bench/simulator.json."""

from __future__ import annotations

import json
import time
from pathlib import Path

from bench.sections import kept_sections
from unicron.cli.files import read_text
from unicron.core.taxonomy import TAXONOMY
from unicron.sim import interruptions
from unicron.sim.report import (
    CAUSE_COLUMNS,
    COLUMNS,
    LEGEND,
    plot,
    summary_cells,
    summary_notes,
    summary_rows,
    to_json,
)
from unicron.sim.runner import SimulationReport, simulate
from unicron.sim.scenario import parse_scenario

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ("figure3", "trace-a", "trace-b", "llama3")
PAPER = {  # Unicron over each baseline, as reported (secondary accounts; see docs/design.md)
    "trace-a": {"megatron": "1.2x", "oobleck": "3.7x", "varuna": "4.8x"},
    "trace-b": {"megatron": "1.9x", "oobleck": "3.8x", "varuna": "5.8x"},
}


def torchft_measured() -> dict[str, float]:
    """torchft's detection, heal and per-step cost as this repository's benchmarks measured them
    (issue 18): detection of a crash and of a hang and the crashed group's heal from
    docs/bench/recovery.json (``bench/torchft_recovery.py``), the failure-free efficiency from
    docs/bench/overhead.json (torchrun + DDP step over torchft's, gpt-10m at its most workers,
    at most 1). The simulator's torchft policy runs on these, not on guesses."""
    bench = ROOT / "docs" / "bench"
    recovery, overhead = (json.loads((bench / f).read_text()) for f in ("recovery.json", "overhead.json"))
    crash, hang = recovery["worker_crash"]["torchft"], recovery["hang"]["torchft"]
    cells = [r for r in overhead["rows"] if r["model"] == "gpt-10m" and "torchft_step_s" in r]
    cell = max(cells, key=lambda r: r["workers"])
    return {
        "crash_detection_s": crash["detection_s"],
        "hang_detection_s": hang["detection_s"],
        "heal_s": crash["heal_s"],
        "efficiency": round(min(1.0, cell["ddp_step_s"] / cell["torchft_step_s"]), 4),
    }


MEASURED = ROOT / "src" / "unicron" / "sim" / "measured.py"


def measured_module(torchft: dict[str, float]) -> str:
    """The text of ``src/unicron/sim/measured.py``: the torchft policy's defaults, as measured,
    so that ``unicron simulate`` replays torchft with what these pages report."""
    body = "\n".join(f'    "{key}": {value!r},' for key, value in sorted(torchft.items()))
    return (
        '"""torchft\'s costs as this repository\'s benchmarks measured them with torchft itself: the\n'
        "detection of a crash and of a hang and the crashed group's heal (docs/bench/recovery.json,\n"
        "bench/torchft_recovery.py) and its failure-free efficiency (docs/bench/overhead.json, gpt-10m at\n"
        "its most workers). Written by bench/simulation_docs.py from those files (`make bench`); not\n"
        'edited by hand: tests/test_sim_measured.py checks it against them."""\n\n'
        f"TORCHFT: dict[str, float] = {{\n{body}\n}}\n"
    )


def write_measured() -> dict[str, float]:
    torchft = torchft_measured()
    MEASURED.write_text(measured_module(torchft))
    return torchft


def interruption_table() -> str:
    """The published mean times between job interruptions against the fitted power law."""
    rows = ["| GPUs in the job | published | fitted | fitted / published |", "|---|---|---|---|"]
    for gpus, hours in interruptions.PUBLISHED:
        fitted = interruptions.job_mtbi_hours(gpus)
        rows.append(f"| {gpus:,} | {hours:.1f} h | {fitted:.1f} h | {fitted / hours:.2f} |")
    return "\n".join(rows)


def run(name: str, overrides: dict[str, dict[str, object]] | None = None) -> SimulationReport:
    path = ROOT / "examples" / "scenarios" / f"{name}.yaml"
    scenario = parse_scenario(read_text(path), str(path))
    torchft = {**torchft_measured(), **scenario.policy_settings.get("torchft", {})}
    settings = {**scenario.policy_settings, "torchft": torchft, **(overrides or {})}
    return simulate(scenario.model_copy(update={"policy_settings": settings}))


def table(report: SimulationReport, paper: dict[str, str] | None = None) -> str:
    """The summary as `unicron simulate` prints it (the same columns and cells), with the
    paper's reported ratios beside ours, and why a policy did not run."""
    head = [*COLUMNS, *(["Unicron ahead by, paper"] if paper else []), *CAUSE_COLUMNS.values()]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in summary_rows(report):
        cells = summary_cells(row)
        if paper:
            cells.insert(len(COLUMNS), paper.get(row["policy"], ""))
        lines.append("| " + " | ".join(cells) + " |")
    notes = summary_notes(report)
    return "\n".join(lines) + "".join(f"\n\n{note}." for note in notes)


def trace_kinds() -> str:
    """The trace format's kinds, from the taxonomy the simulator and the coordinator share."""
    lines = ["| kind | severity | first recovery tier | repair_hours |", "|---|---|---|---|"]
    for kind, info in TAXONOMY.items():
        repair = "the node is out of service for them" if info.needs_repair else "ignored (no repair)"
        lines.append(f"| `{kind.value}` | {info.severity.name} | {info.tier.label} | {repair} |")
    return "\n".join(lines)


SENSITIVITY = (1.0, 0.75, 0.5, 0.25)  # failure-free efficiencies tried for Oobleck and Varuna
ASSUMED = ("oobleck", "varuna")  # baselines whose efficiency is an assumption, not a measurement


def ratio(report: SimulationReport, policy: str) -> float:
    """Unicron's WAF over ``policy``'s in one report (an output of the simulation)."""
    row = next(r for r in summary_rows(report) if r["policy"] == policy)
    value = row["unicron_over_this"]
    return float("nan") if value is None else float(value)


def sensitivity() -> tuple[str, dict[str, dict[str, list[float]]]]:
    """Unicron / baseline on trace-a and trace-b as the assumed failure-free efficiency varies."""
    scenarios = ("trace-a", "trace-b")
    found: dict[str, dict[str, list[float]]] = {p: {n: [] for n in scenarios} for p in ASSUMED}
    for efficiency in SENSITIVITY:
        for name in scenarios:
            report = run(name, {p: {"efficiency": efficiency} for p in ASSUMED})
            for policy in ASSUMED:
                found[policy][name].append(ratio(report, policy))
    head = ["assumed efficiency"] + [f"Unicron / {p} ({n})" for p in ASSUMED for n in scenarios]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, efficiency in enumerate(SENSITIVITY):
        cells = [f"{efficiency:g}"] + [f"{found[p][n][i]:.2f}x" for p in ASSUMED for n in scenarios]
        lines.append("| " + " | ".join(cells) + " |")
    paper = ["paper (reported)"] + [PAPER[n][p] for p in ASSUMED for n in scenarios]
    lines.append("| " + " | ".join(paper) + " |")
    return "\n".join(lines), found


def ours(reports: dict[str, SimulationReport], policy: str) -> str:
    """Unicron / ``policy`` over trace-a and trace-b, as a range."""
    values = sorted(ratio(reports[n], policy) for n in ("trace-a", "trace-b"))
    low, high = f"{values[0]:.1f}", f"{values[-1]:.1f}"
    return f"{low}x" if low == high else f"{low}-{high}x"


TIMED_RUNS = 3  # each scenario simulated this many times; its wall time is the slowest's


def timed_runs(name: str) -> tuple[SimulationReport, list[float]]:
    """The scenario's report (every run gives the same) and each run's wall time."""
    seconds, report = [], None
    for _ in range(TIMED_RUNS):
        started = time.perf_counter()
        report = run(name)
        seconds.append(round(time.perf_counter() - started, 4))
    assert report is not None
    return report, seconds


def main() -> dict[str, object]:
    docs = ROOT / "docs"
    (docs / "bench").mkdir(parents=True, exist_ok=True)
    reports, runs = {}, {}
    for name in SCENARIOS:
        reports[name], runs[name] = timed_runs(name)
        plot(reports[name], docs / f"sim-{name}.png")
    timings = {name: max(seconds) for name, seconds in runs.items()}  # (judged by the slowest)
    waiting = run("trace-b", {"megatron": {"on_node_loss": "wait"}})
    bench = {
        "scenario_7d_128gpu_s": max(timings["trace-a"], timings["trace-b"]),
        "scenario_54d_16384gpu_s": timings["llama3"],
        "seconds": timings,
        "seconds_runs": runs,
        "targets": {"scenario_7d_128gpu_s": 1.0, "scenario_54d_16384gpu_s": 10.0},
        "met": {
            "scenario_7d_128gpu_s": timings["trace-a"] < 1.0 and timings["trace-b"] < 1.0,
            "scenario_54d_16384gpu_s": timings["llama3"] < 10.0,
        },
        "failures": {n: len(r.failures) for n, r in reports.items()},
        "results": {n: to_json(r) for n, r in reports.items()},
    }
    varied, found = sensitivity()
    bench["sensitivity"] = {"efficiency": list(SENSITIVITY), "unicron_over": found}
    torchft = write_measured()  # the CLI's torchft defaults, as these runs use them
    bench["torchft_settings"] = torchft
    (docs / "bench" / "simulator.json").write_text(json.dumps(bench, indent=2) + "\n")
    megatron_llama = reports["llama3"].result("megatron").ratio_to_oracle
    assert megatron_llama is not None, "Megatron runs Llama 3 in the model"
    text = TEMPLATE.format(
        ft_crash=torchft["crash_detection_s"],
        ft_hang=torchft["hang_detection_s"],
        ft_heal=torchft["heal_s"],
        ft_efficiency=torchft["efficiency"],
        sensitivity=varied,
        megatron_llama_loss=1 - megatron_llama,
        trace_kinds=trace_kinds(),
        interruptions=interruption_table(),
        fit=f"mtbi = {interruptions.FIT.scale:.0f} h x gpus^-{interruptions.FIT.exponent:.3f}",
        legend=LEGEND,
        ours_megatron=ours(reports, "megatron"),
        ours_oobleck=ours(reports, "oobleck"),
        ours_varuna=ours(reports, "varuna"),
        paper_megatron=_paper_range("megatron"),
        paper_oobleck=_paper_range("oobleck"),
        paper_varuna=_paper_range("varuna"),
        figure3=table(reports["figure3"]),
        trace_a=table(reports["trace-a"], PAPER["trace-a"]),
        trace_b=table(reports["trace-b"], PAPER["trace-b"]),
        waiting=table(waiting),
        llama3=table(reports["llama3"]),
        t_a=timings["trace-a"],
        t_b=timings["trace-b"],
        t_l=timings["llama3"],
        runs_a=", ".join(f"{t:.2f}" for t in runs["trace-a"]),
        runs_b=", ".join(f"{t:.2f}" for t in runs["trace-b"]),
        runs_l=", ".join(f"{t:.1f}" for t in runs["llama3"]),
        timed=TIMED_RUNS,
        n_a=len(reports["trace-a"].failures),
        n_b=len(reports["trace-b"].failures),
        n_l=len(reports["llama3"].failures),
    )
    page = docs / "simulation.md"
    page.write_text(kept_sections(page, text, ("sweep_bench",)))  # (bench/sweep_bench.py's)
    return bench


def _paper_range(policy: str) -> str:
    values = [PAPER[n][policy] for n in ("trace-a", "trace-b")]
    return values[0] if values[0] == values[1] else f"{values[0].rstrip('x')}-{values[1]}"


TEMPLATE = (Path(__file__).parent / "templates" / "simulation.md").read_text()

if __name__ == "__main__":
    print(json.dumps({k: v for k, v in main().items() if k != "results"}, indent=2))

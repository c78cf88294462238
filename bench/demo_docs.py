"""After `make demo`: its run writes the demo section of docs/live-cluster.md (plans and WAF
tables, from bench/templates/live-cluster.md), docs/demo-waf.png, docs/bench/demo-waf.json and
(where a headless browser ran) docs/dashboard.png.

`python -m bench.demo_docs RUN_DIR` (RUN_DIR: the demo's --root, holding waf.json and waf.png).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

from unicron.cli.demo import plan_row

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = Path(__file__).parent / "templates" / "live-cluster.md"


def _markdown(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def render(comparison: dict[str, Any]) -> str:
    """docs/live-cluster.md for one demo run's figures (its waf.json)."""
    plans = [plan_row(p, p["time_s"]) for p in comparison["plans"] if p.get("changes")]
    phases, ratios = [], []
    for p in comparison["phases"]:
        ratio = p["live_waf"] / p["simulated_waf"] if p["simulated_waf"] else float("nan")
        ratios.append(ratio)
        phases.append(
            [
                f"{p['phase']} ({p['from_s']:.0f}-{p['to_s']:.0f} s)",
                f"{p['live_waf'] / 1e9:.2f}",
                f"{p['simulated_waf'] / 1e9:.2f}",
                f"{ratio:.2f}",
            ]
        )
    if all(r > 1 for r in ratios):
        verdict = "The live system does better than the simulator's model of it in every phase"
    elif all(r < 1 for r in ratios):
        verdict = "The live system does worse than the simulator's model of it in every phase"
    else:
        verdict = "The live system and the simulator's model of it differ by phase"
    verdict += f" (live / simulated {min(ratios):.2f} to {max(ratios):.2f})."
    loss = next(f for f in comparison["simulated_failures"] if f["kind"] == "node_lost")
    return TEMPLATE.read_text().format(
        plans=_markdown(["at", "plan", "answers", "allocation before -> after"], plans),
        phases=_markdown(["phase", "live WAF (GFLOP/s)", "simulated (GFLOP/s)", "live / simulated"], phases),
        verdict=verdict,
        restart_s=comparison["simulated_transition"]["restart_process_s"],
        grow_s=comparison["simulated_transition"]["reconfigure_s"],
        repair_s=loss["repair_s"],
        **log_figures(),
        **measuring_figures(),
    )


def log_figures() -> dict[str, Any]:
    """The bounds of `unicron logs` the page states, from the code."""
    from unicron.control.service.logrelay import ANSWER_WAIT_S, IN_ALL, PER_NODE
    from unicron.core.protocol import LOG_CHUNK_BYTES

    return {
        "log_chunk_kib": LOG_CHUNK_BYTES // 1024,
        "log_wait_s": f"{ANSWER_WAIT_S:g}",
        "per_node": PER_NODE,
        "in_all": IN_ALL,
    }


def measuring_figures() -> dict[str, Any]:
    """How throughput is measured and what a task that declares none is assumed to do, from the
    code: the meter's window and warm-up, the assumed share of peak, the run fields whose keys
    run.env may not set, and the reason a plan gives such a task (planned here, alone, on the
    coordinator's default hardware)."""
    from unicron.control.place.rates import MIN_STEPS, WARMUP_STEPS
    from unicron.core.livespecs import DEFAULT_LIVE_CLUSTER, FIELD_KEYS, parse_live_tasks
    from unicron.core.settings import Settings
    from unicron.planning.planner import ClusterState, plan
    from unicron.planning.throughput import ASSUMED_PEAK_FRACTION, curves_for

    limits = Settings()
    (task,) = parse_live_tasks("name: mine\nweight: 1\nrun: {program: [python, train.py], iterations: 1}\n")
    hardware, slots = DEFAULT_LIVE_CLUSTER, 2
    gpu = hardware.gpu_type()
    alone = ClusterState(
        slots,
        gpu,
        hardware.node_mtbf_hours,
        hardware.planner,
        (0, 1),
        {},
        (task,),
        curves_for([task], gpu, slots, {}),
        next_node=2,
    )
    (decision,) = plan(alone).decisions
    return {
        "measure_window_s": f"{limits.measure_window_s:g}",
        "measure_change_pct": f"{limits.measure_change * 100:g}",
        "measure_skip": WARMUP_STEPS,
        "measure_min_steps": MIN_STEPS,
        "assumed_peak_pct": f"{ASSUMED_PEAK_FRACTION * 100:g}",
        "assumed_reason": decision.reason,
        "field_keys": ", ".join(f"`{key}` (`run.{field}`)" for key, field in FIELD_KEYS.items()),
    }


def main(run_dir: Path) -> None:
    docs = ROOT / "docs"
    comparison = json.loads((run_dir / "waf.json").read_text())
    (docs / "bench" / "demo-waf.json").write_text(json.dumps(comparison, indent=2) + "\n")
    shutil.copyfile(run_dir / "waf.png", docs / "demo-waf.png")
    (docs / "live-cluster.md").write_text(render(comparison))
    print(f"wrote docs/live-cluster.md, docs/demo-waf.png and docs/bench/demo-waf.json from {run_dir}")
    if (run_dir / "dashboard.png").exists():  # taken where a headless browser runs (cli/browser.py)
        shutil.copyfile(run_dir / "dashboard.png", docs / "dashboard.png")
        print(f"wrote docs/dashboard.png from {run_dir}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))

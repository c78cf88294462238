"""`make bench`: run every benchmark; each writes JSON under docs/bench/ and a table in docs/."""

from __future__ import annotations

import json
import sys

from bench import (
    checkpoint_bench,
    decide_bench,
    detection_bench,
    network_bench,
    numerical_bench,
    observe_bench,
    overhead_bench,
    planner_bench,
    recovery_bench,
    reference_docs,
    scale_bench,
    simulation_docs,
    sweep_bench,
    throughput_docs,
    warmstart_bench,
)
from bench.chaos.__main__ import main as chaos_main
from bench.leftovers import RunGuard


def main() -> None:
    guard = RunGuard()  # nothing a benchmark starts may outlive the run
    run_all()
    left = guard.finish()
    if left:
        print("\n".join(["make bench left these behind (now ended):", *left.lines()]), file=sys.stderr)
        sys.exit(1)


def run_all() -> None:
    throughput_docs.main()
    reference_docs.main()
    result = planner_bench.main()
    print(json.dumps({k: v for k, v in result.items() if k != "scaling"}, indent=2))
    # First: its cut-link rows go into the detection and recovery pages written next.
    network = network_bench.main()  # a cut link across test hosts (None where none can be made)
    if network is not None:
        print(json.dumps({k: network[k] for k in ("unicron", "torchrun_tuned")}, indent=2))
    detection = detection_bench.main()
    print(
        json.dumps(
            {
                k: {s: (v or {}).get("median_s") for s, v in e.items() if isinstance(v, dict)}
                for k, e in detection.items()
                if k != "targets"
            },
            indent=2,
        )
    )
    recovery = recovery_bench.main()
    print(
        json.dumps(
            {
                k: {s: (v or {}).get("downtime_s") for s, v in e.items()} if isinstance(e, dict) else e
                for k, e in recovery.items()
            },
            indent=2,
        )
    )
    overhead = overhead_bench.main()
    print(json.dumps({f"{r['model']}@{r['workers']}": r["ratio"] for r in overhead["rows"]}, indent=2))
    # After the overhead benchmark, which writes docs/performance.md anew: its decisions section.
    decided = decide_bench.main([])  # a burst of 100 failures at 2,048 nodes x 8, 100 tasks
    keys = ("nodes", "decision_p50_s", "decision_p99_s", "burst_s", "met")
    print(json.dumps({k: decided[k] for k in keys}, indent=2))
    numerical = numerical_bench.main([])  # the gradient sum's test: its cost, and what it catches
    print(json.dumps({f"{r['workers']} workers": r["ratio"] for r in numerical["rows"]}, indent=2))
    started = warmstart_bench.main()  # a worker's start: forked by its agent's server, or a new interpreter
    print(json.dumps({k: started[k] for k in ("cold_start_s", "warm_start_s", "cold_cpu_s", "warm_cpu_s")}))
    # What periodic checkpoints cost a sharded task, written before going on or in the background.
    saved = checkpoint_bench.main()
    print(json.dumps({k: saved[k] for k in ("mean_step_s", "cost_per_checkpoint_s")}, indent=2))
    # After the recovery and overhead benchmarks: the simulator's torchft policy takes its
    # detection, heal and per-step cost from what they measured with torchft.
    sim = simulation_docs.main()
    print(json.dumps({k: v for k, v in sim.items() if k != "results"}, indent=2))
    swept = sweep_bench.main([])  # after it: Unicron against the baselines over MTBF, size and tasks
    print(json.dumps({"cells": len(swept["rows"]), "seconds": swept["seconds"]}))
    watched = observe_bench.main()  # what a scrape and a dashboard cost the same training
    print(json.dumps({k: watched[k] for k in ("quiet_step_s", "watched_step_s", "ratio")}, indent=2))
    scale = scale_bench.main()  # N simulated agents against each store backend
    print(
        json.dumps(
            [{k: r[k] for k in ("backend", "agents", "p99_s", "cores")} for r in scale["rows"]], indent=2
        )
    )
    chaos_main([])  # the 15-minute soak: docs/bench/chaos.json, docs/reliability.md
    chaos_main(["--ladder", "defaults", "--seed", "2"])  # again, the ladder's defaults: chaos-defaults.json


if __name__ == "__main__":
    main()

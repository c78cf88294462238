"""``python -m bench.chaos [--minutes 15] [--seed 1] [--ladder soak|defaults]``: the soak; writes
docs/bench/chaos.json (or, with the ladder's defaults, chaos-defaults.json) and docs/reliability.md
(``make bench`` runs both)."""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from bench.chaos import report
from bench.chaos.soak import measure


def main(argv: list[str] | None = None) -> dict[str, object]:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__)
    parser.add_argument("--minutes", type=float, default=15.0, help="how long faults are struck (15)")
    parser.add_argument("--seed", type=int, default=1, help="the plan's seed: the same seed, the same plan")
    parser.add_argument("--gap", type=float, default=10.0, help="mean seconds between outside faults")
    parser.add_argument(
        "--ladder",
        choices=("soak", "defaults"),
        default="soak",
        help="soak: short isolation and no give-up rules (the soak's assumption); defaults: the"
        " ladder's own settings, so that isolation and escalation are soaked too",
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="unicron-chaos-") as tmp:
        result = measure(Path(tmp), args.minutes, args.seed, args.gap, args.ladder)
    report.write(result)
    print(json.dumps({k: v for k, v in result.items() if k not in ("strikes", "tasks")}, indent=2))
    return result


if __name__ == "__main__":
    main()

"""`make bench`: run every benchmark; each writes JSON under docs/bench/ and a table in docs/."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import planner_bench, throughput_docs


def main() -> None:
    throughput_docs.main()
    result = planner_bench.main()
    print(json.dumps({k: v for k, v in result.items() if k != "scaling"}, indent=2))


if __name__ == "__main__":
    main()

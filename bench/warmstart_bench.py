"""What starting a worker costs: forked from a fork server (warm) against a new interpreter (cold).

Both sides are the agent's own two ways of starting a worker (``control.warmstart`` and the cold
start of ``control.agent``), with the same program, environment and log, in the same run,
alternating round by round. The program is what a training worker does before its first step:
import torch and the training library, then one AdamW step on a small model (the first step
imports dynamo). A round starts ``WORKERS`` workers at once, as a node restarting its slots
does; start_s is from the launch to the program's "ready" line, the median over a round's
workers, then over the rounds. The warm side's server is started before the rounds (its start,
paid once per environment, at the agent's start for its own, is reported apart as
server_start_s).

Writes docs/bench/warmstart.json and docs/warm-start.md (run by `make bench`).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from unicron.control.processes import Supervised, start_cold
from unicron.control.warmstart import WarmStarts

ROOT = Path(__file__).resolve().parents[1]
WORKERS = 2  # a node's slots, restarted together
ROUNDS = int(os.environ.get("UNICRON_BENCH_REPEATS", "5"))
PROGRAM = """
import json, time
import torch
import unicron.train

model = torch.nn.Linear(64, 64)
optimizer = torch.optim.AdamW(model.parameters())
model(torch.ones(8, 64)).sum().backward()
optimizer.step()
print(json.dumps({"ready": time.time()}), flush=True)
"""


async def _round(start: Any, folder: Path, side: str, index: int) -> float:
    """Start WORKERS programs at once; the median time from launch to ready."""
    program = folder / "program.py"
    launched: list[tuple[float, Path, Supervised]] = []
    for rank in range(WORKERS):
        log = folder / f"{side}-{index}-{rank}.log"
        began = time.time()
        env = {**os.environ, "RANK": str(rank), "PYTHONUNBUFFERED": "1"}
        launched.append((began, log, await start([sys.executable, str(program)], env, log)))
    seconds = []
    for began, log, process in launched:
        if await process.wait() != 0:
            raise RuntimeError(f"the benchmark's program failed: {log.read_text()[-2000:]}")
        ready = json.loads(log.read_text().splitlines()[-1])["ready"]
        seconds.append(ready - began)
    return statistics.median(seconds)


async def measure(folder: Path) -> dict[str, Any]:
    (folder / "program.py").write_text(PROGRAM)
    warm = WarmStarts(folder / "servers")
    began = time.time()
    server = warm.prepare({**os.environ, "PYTHONUNBUFFERED": "1"})  # as the agent does at its start
    if server is None or await server is None:
        raise RuntimeError(f"the fork server did not start: see {folder / 'servers'}")
    server_start = time.time() - began
    sides: dict[str, list[float]] = {"cold": [], "warm": []}
    for index in range(ROUNDS):
        order = ("cold", "warm") if index % 2 == 0 else ("warm", "cold")
        for side in order:
            start = start_cold if side == "cold" else warm.launch
            sides[side].append(await _round(start, folder, side, index))
    await warm.close()
    cold_s, warm_s = statistics.median(sides["cold"]), statistics.median(sides["warm"])
    return {
        "workers": WORKERS,
        "rounds": ROUNDS,
        "cold_start_s": round(cold_s, 3),
        "warm_start_s": round(warm_s, 3),
        "ratio": round(warm_s / cold_s, 4),
        "server_start_s": round(server_start, 3),
        "cold_rounds_s": [round(s, 3) for s in sides["cold"]],
        "warm_rounds_s": [round(s, 3) for s in sides["warm"]],
        "cpus": os.cpu_count(),
    }


def main() -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="unicron-warmstart-") as tmp:
        result = asyncio.run(measure(Path(tmp)))
    (ROOT / "docs" / "bench").mkdir(parents=True, exist_ok=True)
    (ROOT / "docs" / "bench" / "warmstart.json").write_text(json.dumps(result, indent=2) + "\n")
    template = (Path(__file__).parent / "templates" / "warm-start.md").read_text()
    (ROOT / "docs" / "warm-start.md").write_text(template.format(**result))
    return result


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))

"""What starting a worker costs: forked from a fork server (warm) against a new interpreter (cold).

Both sides are the agent's own two ways of starting a worker (``control/agent/warmstart.py`` and
``supervisor.start_new``), with the same program, environment and log, in the same run,
alternating round by round. The program is what a training worker does before its first step:
import torch and the training library, then one AdamW step on a small model (the first step
imports dynamo). A round starts ``WORKERS`` workers at once, as a node restarting its slots
does; the start is from the launch to the program's "ready" line, and the CPU the worker's own
process spent until then; each the median over a round's workers, then over the rounds. The
warm side's server is started by its first launch, before the rounds: that launch's start (the
server's imports and a fork, paid once per environment on a node) is reported apart as
first_warm_start_s.

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

from unicron.control.agent.processes import Supervised
from unicron.control.agent.supervisor import start_new
from unicron.control.agent.warmstart import WarmStarts

ROOT = Path(__file__).resolve().parents[1]
WORKERS = 2  # a node's slots, restarted together
ROUNDS = int(os.environ.get("UNICRON_BENCH_REPEATS", "5"))
PROGRAM = """
import json, resource, time
import torch
import unicron.train

model = torch.nn.Linear(64, 64)
optimizer = torch.optim.AdamW(model.parameters())
model(torch.ones(8, 64)).sum().backward()
optimizer.step()
used = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"ready": time.time(), "cpu_s": used.ru_utime + used.ru_stime}), flush=True)
"""


async def _start(start: Any, folder: Path, name: str, rank: int) -> tuple[float, Path, Supervised]:
    log = folder / f"{name}-{rank}.log"
    log.touch()  # (the agent creates a worker's log before it starts)
    env = {**os.environ, "RANK": str(rank), "PYTHONUNBUFFERED": "1"}
    began = time.time()
    process = await start([sys.executable, str(folder / "program.py")], env, log)
    if process is None:
        raise RuntimeError(f"the fork server did not serve: see {folder / 'servers'}")
    return began, log, process


async def _ready(began: float, log: Path, process: Supervised) -> tuple[float, float]:
    """The worker's seconds from launch to ready, and the CPU its process spent until then."""
    if await process.wait() != 0:
        raise RuntimeError(f"the benchmark's program failed: {log.read_text()[-2000:]}")
    ready = json.loads(log.read_text().splitlines()[-1])
    return ready["ready"] - began, ready["cpu_s"]


async def _round(start: Any, folder: Path, side: str, index: int) -> tuple[float, float]:
    """Start WORKERS programs at once; the medians of their starts and of their CPU."""
    launched = [await _start(start, folder, f"{side}-{index}", rank) for rank in range(WORKERS)]
    seen = [await _ready(*one) for one in launched]
    return statistics.median(s for s, _ in seen), statistics.median(c for _, c in seen)


async def measure(folder: Path) -> dict[str, Any]:
    (folder / "program.py").write_text(PROGRAM)
    warm = WarmStarts(folder / "servers")
    first_s, _ = await _ready(*await _start(warm.launch, folder, "first", 0))  # starts the server
    sides: dict[str, list[tuple[float, float]]] = {"cold": [], "warm": []}
    for index in range(ROUNDS):
        order = ("cold", "warm") if index % 2 == 0 else ("warm", "cold")
        for side in order:
            start = start_new if side == "cold" else warm.launch
            sides[side].append(await _round(start, folder, side, index))
    await warm.close()
    cold_s, warm_s = (statistics.median(s for s, _ in sides[k]) for k in ("cold", "warm"))
    cold_cpu, warm_cpu = (statistics.median(c for _, c in sides[k]) for k in ("cold", "warm"))
    return {
        "workers": WORKERS,
        "rounds": ROUNDS,
        "cold_start_s": round(cold_s, 3),
        "warm_start_s": round(warm_s, 3),
        "ratio": round(warm_s / cold_s, 4),
        "cold_cpu_s": round(cold_cpu, 3),
        "warm_cpu_s": round(warm_cpu, 3),
        "first_warm_start_s": round(first_s, 3),
        "cold_rounds_s": [round(s, 3) for s, _ in sides["cold"]],
        "warm_rounds_s": [round(s, 3) for s, _ in sides["warm"]],
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

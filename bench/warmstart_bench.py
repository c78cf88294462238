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

A task's own heavy imports (``run.preload``): the same measure for a program that also imports
Hugging Face Transformers and steps a small Llama, forked from a server that imported torch's
modules alone against one that imported Transformers too (``UNICRON_PRELOAD``, as the
coordinator sets it for ``run.preload: [transformers.models.llama.modeling_llama]``), alternating likewise.

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
# The same, with a Transformers model (examples/hf-llama's kind, far smaller).
HF_PROGRAM = PROGRAM.replace(
    "model = torch.nn.Linear(64, 64)",
    "from transformers import LlamaConfig, LlamaForCausalLM\n"
    "config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,\n"
    "                     num_attention_heads=2, num_key_value_heads=2)\n"
    "model = LlamaForCausalLM(config)",
).replace("model(torch.ones(8, 64)).sum()", "model(torch.zeros(2, 8, dtype=torch.long)).logits.sum()")
# What the program imports, as deep as it imports it: Transformers' top package is a shell that
# imports a model's classes when they are first named (about 0.5 s, then 0.6 s more for Llama's).
PRELOADED = {"UNICRON_PRELOAD": "transformers.models.llama.modeling_llama"}


async def _start(
    start: Any,
    folder: Path,
    name: str,
    rank: int,
    program: str = "program.py",
    extra: dict[str, str] | None = None,
) -> tuple[float, Path, Supervised]:
    log = folder / f"{name}-{rank}.log"
    log.touch()  # (the agent creates a worker's log before it starts)
    env = {**os.environ, "RANK": str(rank), "PYTHONUNBUFFERED": "1", **(extra or {})}
    began = time.time()
    process = await start([sys.executable, str(folder / program)], env, log)
    if process is None:
        raise RuntimeError(f"the fork server did not serve: see {folder / 'servers'}")
    return began, log, process


async def _ready(began: float, log: Path, process: Supervised) -> tuple[float, float]:
    """The worker's seconds from launch to ready, and the CPU its process spent until then."""
    if await process.wait() != 0:
        raise RuntimeError(f"the benchmark's program failed: {log.read_text()[-2000:]}")
    ready = json.loads(log.read_text().splitlines()[-1])
    return ready["ready"] - began, ready["cpu_s"]


async def _round(start: Any, folder: Path, side: str, index: int, *how: Any) -> tuple[float, float]:
    """Start WORKERS programs at once; the medians of their starts and of their CPU."""
    launched = [await _start(start, folder, f"{side}-{index}", rank, *how) for rank in range(WORKERS)]
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
    hf = await measure_preload(folder, warm)
    await warm.close()
    cold_s, warm_s = (statistics.median(s for s, _ in sides[k]) for k in ("cold", "warm"))
    cold_cpu, warm_cpu = (statistics.median(c for _, c in sides[k]) for k in ("cold", "warm"))
    return {
        **hf,
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


async def measure_preload(folder: Path, warm: WarmStarts) -> dict[str, Any]:
    """The Transformers program forked from the torch-only server and from one that preloaded
    Transformers (each server started by a first launch before the rounds)."""
    (folder / "hf.py").write_text(HF_PROGRAM)
    how = {"hf_torch_only": ("hf.py", None), "hf_preloaded": ("hf.py", PRELOADED)}
    for side, (program, extra) in how.items():
        await _ready(*await _start(warm.launch, folder, f"{side}-first", 0, program, extra))
    sides: dict[str, list[tuple[float, float]]] = {side: [] for side in how}
    for index in range(ROUNDS):
        for side in list(how) if index % 2 == 0 else list(how)[::-1]:
            sides[side].append(await _round(warm.launch, folder, side, index, *how[side]))
    plain_s, preloaded_s = (statistics.median(s for s, _ in sides[k]) for k in how)
    plain_cpu, preloaded_cpu = (statistics.median(c for _, c in sides[k]) for k in how)
    return {
        "hf_torch_only_start_s": round(plain_s, 3),
        "hf_preloaded_start_s": round(preloaded_s, 3),
        "hf_ratio": round(preloaded_s / plain_s, 4),
        "hf_torch_only_cpu_s": round(plain_cpu, 3),
        "hf_preloaded_cpu_s": round(preloaded_cpu, 3),
        "hf_torch_only_rounds_s": [round(s, 3) for s, _ in sides["hf_torch_only"]],
        "hf_preloaded_rounds_s": [round(s, 3) for s, _ in sides["hf_preloaded"]],
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

"""Running the example under torchrun, the baseline both latency benchmarks compare with.

The same training script and fault library run under `torch.distributed.run` (4 workers on one
node, gloo); the workers write their trace (starts, faults, SIGTERMs, exceptions, completed
steps) to a JSON-lines file, which is all torchrun lets us observe.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any

TRAIN = Path(__file__).resolve().parents[1] / "examples" / "tinygpt" / "train.py"


def launcher(workers: int) -> list[str]:
    """torchrun on this host alone (its own rendezvous store) with ``workers`` workers."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(workers)]


def trace_rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


class Torchrun:
    """One torchrun job with one fault (in its first generation); stopped on exit."""

    def __init__(
        self,
        root: Path,
        fault: dict[str, Any] | None,
        train_args: list[str],
        pg_timeout: float,
        max_restarts: int = 1,
    ) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.trace = root / "trace.jsonl"
        env = {
            **os.environ,
            "UNICRON_TRACE_FILE": str(self.trace),
            "UNICRON_PG_TIMEOUT": str(pg_timeout),
            "UNICRON_FAULTS": json.dumps([{**fault, "generation": 1}] if fault else []),
            # torchrun shares its rendezvous TCPStore with the workers by default, and a relaunched
            # worker then reads the previous attempt's gloo addresses and never connects
            # (pytorch/pytorch#135712); its documented workaround is to opt out of the sharing.
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        }
        cmd = [
            *launcher(4),
            "--max-restarts",
            str(max_restarts),
            "--monitor-interval",
            "0.1",
            str(TRAIN),
            *train_args,
            "--checkpoint-dir",
            str(root / "ckpt"),
        ]
        with (root / "torchrun.log").open("wb") as log:
            self.process = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )

    def rows(self) -> list[dict[str, Any]]:
        return trace_rows(self.trace)

    def freeze_node(self, ranks: tuple[int, ...] = (2, 3), after_step: int = 10) -> float:
        """Once training passed ``after_step``, stop ``ranks`` (SIGSTOP: a node's worth of
        workers gone silent with their connections open); returns when."""
        deadline = time.time() + 120
        while time.time() < deadline and not any(
            r["what"] == "samples" and r["step"] >= after_step for r in self.rows()
        ):
            time.sleep(0.02)
        frozen = time.time()
        for r in self.rows():
            if r["what"] == "started" and r["rank"] in ranks:
                os.kill(r["pid"], signal.SIGSTOP)
        return frozen

    def wait(self, seconds: float) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=seconds)

    def __enter__(self) -> Torchrun:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        # torchrun starts its workers in sessions of their own: a stopped (SIGSTOPped or hung)
        # worker outlives the job's process group, so every worker the trace names is killed too.
        for r in self.rows():
            if r["what"] == "started" and runs_train(r["pid"]):  # (not a reused pid)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(r["pid"], signal.SIGKILL)


def runs_train(pid: int) -> bool:
    try:
        return str(TRAIN) in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False

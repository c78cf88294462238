"""Every torchft replica group in the first quorum, as torchrun's rendezvous puts every rank in
the first world: the benchmarks compare worlds that start whole.

    BENCH_START_DIR=DIR NUM_REPLICA_GROUPS=N REPLICA_GROUP_ID=G python bench/torchft_start.py SCRIPT [ARGS...]

Why a gate: torchft's lighthouse waits (``--join_timeout_ms``) only for stragglers that already
heartbeat. A group whose manager does not exist yet (its worker still importing torch on a busy
machine) is not waited for, so with ``--min_replicas`` under the group count the groups that
came first form a quorum without it and train on; the late group joins steps later, healing
from them. A fault planned for its fourth step then falls after the others finished, or never.

So every process creates its ``torchft.Manager`` as the script says, and then waits until the
first rank of every group has created its own (whose manager server heartbeats the lighthouse
from then on): ``DIR/ready-<G>`` marks that. From there the lighthouse holds the first quorum
until all of them joined. A worker torchrun restarts finds every mark present and goes on.
The training script is not changed: ``Manager.__init__`` is wrapped, from outside.
"""

from __future__ import annotations

import os
import runpy
import sys
import time
from pathlib import Path
from typing import Any

WAIT_S = 180.0  # for the other groups' managers: longer than a cold start of torch on a busy machine


def arrive(gate: Path, group: int, first_rank: bool) -> None:
    """Mark this group ready (from its first rank, whose manager serves the group)."""
    if first_rank:
        gate.mkdir(parents=True, exist_ok=True)
        (gate / f"ready-{group}").touch()


def wait_for_all(gate: Path, groups: int, wait_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + wait_s
    while missing := [g for g in range(groups) if not (gate / f"ready-{g}").exists()]:
        if time.monotonic() > deadline:
            raise RuntimeError(f"torchft replica groups {missing} created no manager in {wait_s:.0f} s")
        time.sleep(0.02)


def main() -> None:
    from torchft import manager

    script, *args = sys.argv[1:]
    gate, groups = Path(os.environ["BENCH_START_DIR"]), int(os.environ["NUM_REPLICA_GROUPS"])
    group, first_rank = int(os.environ["REPLICA_GROUP_ID"]), os.environ.get("RANK", "0") == "0"
    created = manager.Manager.__init__

    def create_then_wait(self: Any, *a: Any, **kw: Any) -> None:
        created(self, *a, **kw)
        arrive(gate, group, first_rank)
        wait_for_all(gate, groups)

    manager.Manager.__init__ = create_then_wait  # type: ignore[method-assign]
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()

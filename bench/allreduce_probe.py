"""One rank of a two-rank gloo all-reduce timing, run on a test host by ``network_bench``.

``python -m bench.allreduce_probe RANK STORE_ADDRESS PORT PHASES FOLDER``: for each of PHASES
phases, both ranks wait for the bench to create ``FOLDER/go-<phase>`` (once it has set that
phase's delay), meet at a barrier, time ``REPEATS`` all-reduces of ``FLOATS`` floats, and rank 0
prints the median in ms as a JSON line.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

FLOATS = 1000
REPEATS = 20


def main() -> None:
    import torch
    import torch.distributed as dist

    rank, address, port, phases = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    folder = Path(sys.argv[5])
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "eth0")  # the test host's one interface
    store = dist.TCPStore(address, port, 2, rank == 0)  # type: ignore[attr-defined]
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    tensor = torch.ones(FLOATS)
    for phase in range(phases):
        while not (folder / f"go-{phase}").exists():
            time.sleep(0.05)
        dist.barrier()
        took = []
        for _ in range(REPEATS):
            began = time.perf_counter()
            dist.all_reduce(tensor)
            took.append(time.perf_counter() - began)
        if rank == 0:
            print(json.dumps({"phase": phase, "allreduce_ms": statistics.median(took) * 1000}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

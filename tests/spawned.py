"""Run a function as the ranks of a real gloo world: one spawned process per rank."""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable
from typing import Any


def run_ranks(target: Callable[..., None], world: int, *args: Any) -> dict[int, Any]:
    """Start ``target(rank, port, out, *args)`` in ``world`` processes (``port``: a free port for
    the rendezvous store); each puts ``(rank, result)`` on ``out``. Returns rank -> result. Results
    cross a queue: plain values, not tensors (a tensor crosses as a handle to the sender's
    memory, gone once it exits)."""
    from unicron.control.launch.localcluster import free_port

    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    port = free_port()
    procs = [ctx.Process(target=target, args=(rank, port, out, *args)) for rank in range(world)]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(60)
    return results

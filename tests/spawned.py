"""Run a function as the ranks of a real gloo world: one process per rank.

The ranks are forked from a fork server that imported torch and the training library once (a
fresh interpreter spent ~2.5 s of CPU importing them, for every rank of every test). The server
starts single-threaded and runs no torch operation, so a forked rank is as a new process would
be, but for its random state: every rank seeds its own generators (the tests do), as gloo and
the session are initialised after the fork."""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable
from typing import Any

from unicron.control.launch import forked

PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "unicron.train"]


def _context() -> mp.context.ForkServerContext:
    # (one server per process, shared with the local clusters' processes: what it imports is read
    # when it first starts, so both ask for both lists)
    return forked.context(also=PRELOAD)


def run_ranks(target: Callable[..., None], world: int, *args: Any) -> dict[int, Any]:
    """Start ``target(rank, port, out, *args)`` in ``world`` processes (``port``: a free port for
    the rendezvous store); each puts ``(rank, result)`` on ``out``. Returns rank -> result. Results
    cross a queue: plain values, not tensors (a tensor crosses as a handle to the sender's
    memory, gone once it exits)."""
    from unicron.control.launch.localcluster import free_port

    ctx = _context()
    out: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
    port = free_port()
    procs = [ctx.Process(target=target, args=(rank, port, out, *args)) for rank in range(world)]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(60)
    return results

"""Faults inside a torchft worker, for the benchmarks (issue 18): the fault actions of Unicron's
fault library (``unicron.train.faults``) that torchft can take part in, injected at the same
point of a step, without changing the training script.

    BENCH_FAULT=ACTION@STEP BENCH_FAULT_LOG=FILE python bench/torchft_faults.py SCRIPT [ARGS...]

- ``kill``: SIGKILL itself as step STEP starts (after step STEP-1's update);
- ``raise``: raise a RuntimeError there, through the training loop (the worker exits with it);
- ``hang``: SIGSTOP itself there (torchft's manager runs in the worker's process, so its
  heartbeats to the lighthouse stop too, as Unicron's hung worker's do);
- ``kill_after_reduce``: SIGKILL itself in step STEP after the gradient all-reduce and the
  commit vote, before the update;
- ``kill_in_backward``: SIGKILL itself in step STEP as its last micro-batch starts (the one
  whose backward pass all-reduces the gradients, outside DDP's ``no_sync``), once the step's
  quorum (which torchft runs in the background) has formed with it: its peers go into that
  all-reduce with a dead rank, as with Unicron's ``kill_in_backward`` (there inside the last
  backward pass, before its first bucket).

Steps are counted as this process applies them (a global optimizer hook; the ``torchft.Optimizer``
wrapper applies only committed steps). Only the first incarnation injects: the worker torchrun
restarts (``TORCHELASTIC_RESTART_COUNT`` above 0) runs clean. Just before acting, the worker
writes ``{"action", "step", "time", "perf"}`` (wall clock and ``time.perf_counter``) to
``BENCH_FAULT_LOG``, the injection's timestamp, as Unicron's workers report theirs.
"""

from __future__ import annotations

import gc
import json
import os
import runpy
import signal
import sys
import time
from pathlib import Path
from typing import Any

ACTIONS = ("kill", "raise", "hang", "kill_after_reduce", "kill_in_backward")
AT_STEP_START = ("kill", "raise", "hang")


def parse(spec: str) -> tuple[str, int]:
    action, _, step = spec.partition("@")
    if action not in ACTIONS or not step.isdigit():
        raise SystemExit(f"BENCH_FAULT={spec!r}: say ACTION@STEP, ACTION one of {', '.join(ACTIONS)}")
    return action, int(step)


def inject(action: str, step: int, log: Path) -> None:
    log.write_text(
        json.dumps({"action": action, "step": step, "time": time.time(), "perf": time.perf_counter()})
    )
    if action == "raise":
        raise RuntimeError(f"injected fault at step {step}")
    os.kill(os.getpid(), signal.SIGSTOP if action == "hang" else signal.SIGKILL)


def main() -> None:
    from torch.nn.modules.module import register_module_forward_pre_hook
    from torch.nn.parallel import DistributedDataParallel
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
    from torchft import Manager

    script, *args = sys.argv[1:]
    spec, log = os.environ.get("BENCH_FAULT", ""), Path(os.environ.get("BENCH_FAULT_LOG", "fault.json"))
    if spec and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
        action, at = parse(spec)
        applied = [0]  # steps this process has applied

        def before_update(optimizer: Any, *_: Any) -> None:
            if action == "kill_after_reduce" and applied[0] == at:
                inject(action, at, log)

        def after_update(optimizer: Any, *_: Any) -> None:
            applied[0] += 1
            if action in AT_STEP_START and applied[0] == at:
                inject(action, at, log)

        def last_micro_batch(module: Any, *_: Any) -> None:
            syncing = isinstance(module, DistributedDataParallel) and module.require_backward_grad_sync
            if action == "kill_in_backward" and syncing and applied[0] == at:
                # The step's quorum runs in the background from zero_grad on: wait for it, so
                # that this group is in it and its peers' all-reduce counts on it (the script's
                # Manager, found among the live objects: the script is not changed).
                manager = next(o for o in gc.get_objects() if isinstance(o, Manager))
                manager.wait_quorum()
                inject(action, at, log)

        register_optimizer_step_pre_hook(before_update)
        register_optimizer_step_post_hook(after_update)
        register_module_forward_pre_hook(last_micro_batch)
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()

"""Run a training script and record when each optimizer step ends, the same way under torchrun +
DDP and under Unicron (the overhead benchmark, ``bench/overhead_bench.py``).

    python bench/steptimes.py OUT_DIR SCRIPT [ARGS...]

A global optimizer post-step hook (``torch.optim.optimizer.register_optimizer_step_post_hook``)
notes ``time.perf_counter()`` after every ``optimizer.step()``; at exit the process writes the
list to ``OUT_DIR/steps-<pid>.json``. Nothing in the script changes. On a GPU the hook first
waits for the device (``torch.cuda.synchronize``), on both sides alike, so that a step's end is
when the GPU finished it rather than when its kernels were queued. In a pinned cell
(``bench/pinning.py``) the process first moves to its own core.
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import sys
import time
from pathlib import Path
from typing import Any

from pinning import pin_worker  # run as a script: its folder (bench/) is first on sys.path


def main() -> None:
    pin_worker()  # first: the threads started later (torch's, gloo's, the script's) inherit its core
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    out, script, *args = sys.argv[1:]
    ends: list[float] = []

    def note(optimizer: Any, *_: Any) -> None:
        if torch.cuda.is_initialized():  # the step ends when the GPU has done it
            torch.cuda.synchronize()
        ends.append(time.perf_counter())

    def write() -> None:
        if ends:
            Path(out, f"steps-{os.getpid()}.json").write_text(json.dumps(ends))

    register_optimizer_step_post_hook(note)
    atexit.register(write)
    sys.argv = [script, *args]
    sys.path[0] = str(Path(script).resolve().parent)  # as ``python SCRIPT`` has it (its own imports)
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()

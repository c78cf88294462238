"""The training library under plain torchrun (the baseline of the benchmarks): env:// rendezvous,
ranks from torchrun, and the same result as one process over the same global batches."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from unicron.train.checkpoint import load_latest

from .test_live_cluster import ARGS, TRAIN, assert_same_state, prefetch_reference, reference

ITERATIONS = 20  # as many as test_live_tail's: one failure-free run for both


@pytest.mark.timeout(300)
def test_torchrun_run_matches_a_single_process(tmp_path: Path) -> None:
    prefetch_reference(ITERATIONS)  # trained beside the ranks
    out = tmp_path / "torchrun"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",  # a free port of its own, not the default 29500 another job may hold
            "--nproc-per-node",
            "4",
            str(TRAIN),
            *ARGS,
            "--iterations",
            str(ITERATIONS),
            "--checkpoint-dir",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    state = load_latest(out)
    assert state is not None and state["step"] == ITERATIONS and state["world_size"] == 4
    assert_same_state(state, reference(ITERATIONS))


CLOSE_PROBE = """
import os
import torch
import unicron.train as ut
session = ut.init(iterations=1).start()
torch.optim.AdamW(torch.nn.Linear(2, 2).parameters())  # a script's optimizer imports torch._dynamo
import sys
# (a model that is not sharded never needs it: checkpoint._read_sharded_checked)
print(f"checkpoint module loaded: {'torch.distributed.checkpoint' in sys.modules}", flush=True)
session.close()
sockets = 0
for fd in os.listdir("/proc/self/fd"):
    try:
        sockets += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
    except OSError:
        pass
# One write per line (a pipe keeps it whole): the two ranks share torchrun's stdout.
print(f"sockets after close: {sockets}", flush=True)
"""


@pytest.mark.timeout(300)
def test_close_releases_the_process_group_under_torchrun(tmp_path: Path) -> None:
    """Found by a flaky abort at exit: under torchrun the group was made before torch._dynamo was
    imported (the script's optimizer imports it), which pins the group for good
    (docs/pytorch-notes.md), so close() left its gloo sockets open and a live gloo group
    reached interpreter exit (SIGABRT there, now and then)."""
    probe = tmp_path / "probe.py"
    probe.write_text(CLOSE_PROBE)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(probe)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.count("sockets after close: 0") == 2, run.stdout
    assert run.stdout.count("checkpoint module loaded: False") == 2, run.stdout

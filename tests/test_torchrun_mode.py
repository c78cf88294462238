"""The training library under plain torchrun (the baseline of the benchmarks): env:// rendezvous,
ranks from torchrun, and the same result as one process over the same global batches."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from unicron.train.checkpoint import load_latest

from .test_live_cluster import ARGS, TRAIN, assert_same_state, reference


@pytest.mark.timeout(300)
def test_torchrun_run_matches_a_single_process(tmp_path: Path) -> None:
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
            "12",
            "--checkpoint-dir",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    state = load_latest(out)
    assert state is not None and state["step"] == 12 and state["world_size"] == 4
    assert_same_state(state, reference(tmp_path, 12))

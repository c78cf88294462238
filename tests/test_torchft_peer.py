"""torchft, the peer the benchmarks measure (issue 18), runs for real here: its lighthouse and
one torchrun job per replica group, examples/torchft/train_torchft.py written the way torchft's
own examples are. Without failures it must train exactly what the DDP original trains, or the
benchmarks would compare different work."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from bench import torchft_side

ROOT = Path(__file__).resolve().parents[1]
ARGS = ["--iterations", "12", "--dtype", "float64"]


@pytest.mark.timeout(300)
def test_torchft_without_failures_trains_what_ddp_trains(tmp_path: Path) -> None:
    times = torchft_side.run_groups(tmp_path / "torchft", 2, ARGS)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd += [
        str(ROOT / "examples" / "ddp-port" / "train_ddp.py"),
        *ARGS,
        "--checkpoint",
        str(tmp_path / "ddp.pt"),
    ]
    subprocess.run(
        cmd, check=True, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=240
    )
    ddp, peer = torch.load(tmp_path / "ddp.pt"), torch.load(tmp_path / "torchft" / "final-0.pt")
    # Every one of the 12 steps was committed by both groups (the step-time hook saw each).
    assert [len(p.read_text().split(",")) for p in sorted(times.glob("steps-*.json"))] == [12, 12]
    assert peer["step"] == ddp["step"] == 12
    # Same samples, same averaged gradients, same updates: the same bits (float64).
    for name, tensor in ddp["model"].items():
        assert torch.equal(peer["model"][name], tensor), name
    assert peer["scheduler"]["last_epoch"] == ddp["scheduler"]["last_epoch"]


def test_the_managers_log_gives_quorums_and_commit_votes_in_wall_clock_time(tmp_path: Path) -> None:
    """What bench/torchft_recovery.py reads: torchft's manager log lines (a real line's shape)."""
    groups = torchft_side.Groups.__new__(torchft_side.Groups)
    groups.root = tmp_path
    member = 'QuorumMember { replica_id: "g:1", step: 3, world_size: 1 }'
    prefix = "[INFO] -"
    (tmp_path / "group-0.log").write_text(
        f"2026-11-26T00:40:29.884 {prefix} got lighthouse quorum Quorum {{ quorum_id: 4, "
        f"[{member}, {member}] }}\n"
        f"2026-11-26T00:40:29.899 {prefix} should_commit completed should_commit=true\n"
        "a line of the script's own\n"
        f"2026-11-26T00:40:31.500 {prefix} got lighthouse quorum Quorum {{ quorum_id: 5, [{member}] }}\n"
        f"2026-11-26T00:40:31.512 {prefix} should_commit completed should_commit=false\n"
    )
    base = 1795653629.884  # 2026-11-26T00:40:29.884 UTC
    assert [(round(t - base, 3), i, n) for t, i, n in groups.quorums(0)] == [(0.0, 4, 2), (1.616, 5, 1)]
    assert [(round(t - base, 3), ok) for t, ok in groups.commits(0)] == [(0.015, True), (1.628, False)]


LATE_S = 6.0  # how much later than group 0 the test starts group 1 (a worker slow to come up)


class LateGroups(torchft_side.Groups):
    """Groups whose group 1 is started ``LATE_S`` after the others."""

    def _start(self, group: int) -> subprocess.Popen[bytes]:
        if group == 1:
            time.sleep(LATE_S)
        return super()._start(group)


@pytest.mark.timeout(300)
def test_a_fault_inside_a_torchft_worker_strikes_its_step_and_torchrun_restarts_it(tmp_path: Path) -> None:
    """bench/torchft_faults.py, which the torchft entries of the recovery and detection benchmarks
    rest on: group 1's worker kills itself after step 4's all-reduce and commit vote, before its
    update; the other group commits that step (the sum was complete), the restarted worker heals
    from it, and both groups end at the last step. Group 1 comes up seconds late: group 0 waits
    for it before its first quorum (bench/torchft_start.py), or it would train alone."""
    args = ["--iterations", "10", "--dtype", "float64", "--step-delay", "0.05"]
    with LateGroups(tmp_path, 2, args, restarts=1, min_replicas=1, faults={1: "kill_after_reduce@4"}) as g:
        stamp = g.injected(1)
        g.wait(timeout_s=240)
        survivor = [ok for t, ok in g.commits(0)]
        healed = [t for t, ok in g.commits(1) if ok and t > stamp["time"]]
        # Group 0's quorums up to the fault: the failed worker was in every one, late as it came.
        sizes = [n for t, _, n in g.quorums(0) if t <= stamp["time"]]
    assert stamp["action"] == "kill_after_reduce" and stamp["step"] == 4
    assert sizes == [2] * 5, "both groups in the quorum of steps 0-4"
    assert survivor[4], "the survivor committed the step whose sum the failed worker had joined"
    assert healed, "the restarted worker committed steps after the fault"
    assert torch.load(tmp_path / "final-0.pt")["step"] == 10
    # Only the first incarnation injects: the restarted worker logged no second fault.
    assert g.fault_log(1).read_text().count("kill_after_reduce") == 1


def test_a_fault_spec_the_injector_cannot_read_names_the_fix() -> None:
    from bench import torchft_faults

    with pytest.raises(SystemExit, match="ACTION@STEP"):
        torchft_faults.parse("explode@3")
    assert torchft_faults.parse("raise@20") == ("raise", 20)


HSDP_ARGS = ["--iterations", "6", "--dtype", "float64", "--layers", "2", "--hidden", "64", "--heads", "4"]
HSDP_ARGS += ["--sequence", "32", "--vocab", "64"]


@pytest.mark.timeout(400)
def test_torchft_replica_groups_of_two_ranks_train_what_fsdp2_hsdp_trains(tmp_path: Path) -> None:
    """The sharded rows' peer: 2 torchft replica groups of 2 ranks (FSDP2 inside each group, the
    cross-group sum through torchft's manager) against torchrun + FSDP2 HSDP at the same shape
    (2 replicas x 2 shards), same samples in the same order: the same parameters (float64; the
    sums are grouped differently, so equal to rounding, not bit for bit)."""
    torchft_side.run_groups(tmp_path / "torchft", 2, HSDP_ARGS, timeout_s=300, ranks=2)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4"]
    cmd += [str(ROOT / "examples" / "fsdp" / "train_hsdp.py"), *HSDP_ARGS, "--replica-size", "2"]
    cmd += ["--checkpoint", str(tmp_path / "hsdp.pt")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(cmd, check=True, capture_output=True, env=env, timeout=300)
    hsdp, peer = torch.load(tmp_path / "hsdp.pt"), torch.load(tmp_path / "torchft" / "final-0.pt")
    assert peer["step"] == hsdp["step"] == 6
    for name, tensor in hsdp["model"].items():
        torch.testing.assert_close(peer["model"][name], tensor, rtol=1e-12, atol=1e-14, msg=name)

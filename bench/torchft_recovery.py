"""torchft's recovery per failure class: the recovery benchmark's torchft entries (issue 18).

Four replica groups of one rank (as Unicron's cell has 4 workers) train
examples/torchft/train_torchft.py with the recovery benchmark's model, data, batch and step
delay; each group is a torchrun job that restarts its worker (torchft leaves restarting to the
launcher: a restarted worker heals from a live group). Group 1 gets the fault at step
``FAULT_STEP``, from inside its worker as Unicron's fault library injects it
(``bench/torchft_faults.py``, the same actions at the same point of the step), or from outside:

- worker_crash (``kill``, the detection benchmark's process_exit): SIGKILL as the step starts;
  torchrun restarts the worker and it heals from a live group.
- crash_after_allreduce (``kill_after_reduce``): SIGKILL after the step's all-reduce and
  commit vote, before the update; restarted and healed the same way.
- crash_in_backward (``kill_in_backward``): SIGKILL as the step's last micro-batch starts,
  after the step's quorum: the survivors' all-reduce fails, and the step is not committed.
- exception (``raise``): a RuntimeError out of the training loop as the step starts; the worker
  exits with it, torchrun restarts it.
- hang (``hang``): the worker SIGSTOPs itself as the step starts: its manager's heartbeats stop
  with it, so the lighthouse drops it after its heartbeat timeout; nothing restarts a stopped
  worker.
- node_loss (outside): group 1's worker and its torchrun are stopped (SIGSTOP), as a machine
  that froze (with one-rank groups on one host, the hang with its launcher stopped too).

Per cell: ``detection_s``, from the fault to the survivors' next quorum (their managers' logs:
without group 1, or with its restarted worker); ``downtime_s``, to the end of the survivors'
longest pause after the fault (the step-time hook);
``lost_steps``, the survivors' steps voted not to commit (each drops that global batch);
``lost_microbatches``, those steps' micro-batches on the survivors; ``heal_s``, to the
restarted group's first committed step (the classes whose worker torchrun restarts);
``final_max_abs_diff``, how far the final parameters are from the same groups' failure-free
run (torchft drops a failed step's samples and a healed group starts its data stream again, so
it does not end where that run ends);
``skipped_samples``, the failed group's share of every step committed without it (torchft's
global batch shrinks instead: those samples are never trained on);
``first_quorum_groups``, how many groups the first quorum had: all 4, since every group waits
for the others' managers before its first quorum (``bench/torchft_start.py``; before that gate a
group that came up late on this machine missed step 0 and healed into step 1, as a quorum needs
only 3 here).
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from bench.torchft_side import Groups

GROUPS, FAULTY, FAULT_STEP, ITERATIONS = 4, 1, 20, 60
GLOBAL_BATCH, MICRO_BATCH = 16, 2
ARGS = ["--dtype", "float64", "--global-batch", str(GLOBAL_BATCH), "--micro-batch", str(MICRO_BATCH)]
ARGS += ["--dataset-size", "512", "--step-delay", "0.15", "--iterations", str(ITERATIONS)]
# class: the fault inside the worker (bench/torchft_faults.py), or None for node_loss (outside)
FAULTS = {
    "worker_crash": "kill",
    "crash_after_allreduce": "kill_after_reduce",
    "crash_in_backward": "kill_in_backward",
    "exception": "raise",
    "hang": "hang",
    "node_loss": None,
}
# The actions after which torchrun restarts the worker (and it heals from a live group).
RESTARTED = ("kill", "kill_after_reduce", "kill_in_backward", "raise")
RECOVERY_CLASSES = ("worker_crash", "crash_after_allreduce", "crash_in_backward", "hang", "node_loss")


def reference(root: Path) -> dict[str, Any]:
    """The same groups without a failure: the final state a failed run is compared with."""
    with Groups(root, GROUPS, ARGS) as groups:
        groups.wait()
    state: dict[str, Any] = torch.load(root / "final-0.pt")
    return state


def cell(root: Path, name: str, reference_model: dict[str, torch.Tensor] | None) -> dict[str, Any]:
    """One class's run (``reference_model``: the failure-free run's final parameters, to compare
    with; None: not compared, as in the detection benchmark)."""
    action = FAULTS[name]
    faults = {FAULTY: f"{action}@{FAULT_STEP}"} if action else {}
    with Groups(root, GROUPS, ARGS, restarts=2, min_replicas=GROUPS - 1, faults=faults) as groups:
        survivors = {g: groups.worker(g) for g in range(GROUPS) if g != FAULTY}
        if action:
            stamp = groups.injected(FAULTY)
            at, at_mono = stamp["time"], stamp["perf"]
        else:
            _wait_for_commits(groups, FAULTY, FAULT_STEP)
            at_mono = time.monotonic()
            at = groups.signal(FAULTY, signal.SIGSTOP, launcher_too=True)
        groups.wait(timeout_s=300, groups=list(survivors))
        ends = _step_ends(groups.times, survivors[0])
        lost = sum(not ok for t, ok in groups.commits(0) if t > at)
        quorums = groups.quorums(0)
        current = max((i for t, i, _ in quorums if t <= at), default=-1)
        quorum = next((t for t, i, _ in quorums if t > at and i != current), None)
        healed = next((t for t, ok in groups.commits(FAULTY) if t > at and ok), None)
        short = _short_steps(groups.commits(0), quorums, at)
        final: dict[str, Any] = torch.load(root / "final-0.pt")
    diff = None
    if reference_model is not None:
        diff = max(float((final["model"][k] - v).abs().max()) for k, v in reference_model.items())
    return {
        "detection_s": None if quorum is None else round(quorum - at, 3),
        "downtime_s": _stall(ends, at_mono),
        "lost_steps": lost,
        "lost_microbatches": lost * (GLOBAL_BATCH // (GROUPS * MICRO_BATCH)) * len(survivors),
        "heal_s": None if healed is None or action not in RESTARTED else round(healed - at, 3),
        "final_max_abs_diff": diff,
        "first_quorum_groups": quorums[0][2] if quorums else None,
        # Steps committed without the failed group: its share of each global batch never trained.
        "steps_without_failed_group": short,
        "skipped_samples": short * (GLOBAL_BATCH // GROUPS),
    }


def _wait_for_commits(groups: Groups, group: int, steps: int) -> None:
    deadline = time.monotonic() + 300
    while sum(ok for _, ok in groups.commits(group)) < steps:
        if time.monotonic() > deadline:
            raise RuntimeError(f"group {group} never reached step {steps}: see {groups.log(group)}")
        time.sleep(0.02)


def torchft(root: Path, classes: Sequence[str] = RECOVERY_CLASSES) -> dict[str, dict[str, Any]]:
    """Each class's torchft entry (an entry whose run failed says why)."""
    model = reference(root / "reference")["model"]
    out: dict[str, dict[str, Any]] = {}
    for name in classes:
        try:
            out[name] = cell(root / name, name, model)
        except (RuntimeError, OSError, ValueError, subprocess.TimeoutExpired) as exc:
            out[name] = {"downtime_s": None, "lost_microbatches": None, "note": f"torchft run failed: {exc}"}
    return out


def _short_steps(
    commits: list[tuple[float, bool]], quorums: list[tuple[float, int, int]], fault: float
) -> int:
    """Steps committed after the fault under a quorum of fewer than every group."""

    def groups_at(t: float) -> int:
        return max(((q, n) for q, _, n in quorums if q <= t), default=(0.0, GROUPS))[1]

    return sum(ok and groups_at(t) < GROUPS for t, ok in commits if t > fault)


def _stall(ends: list[float], fault: float, window_s: float = 60.0) -> float | None:
    """From the fault to the end of the survivors' longest pause after it: the step that
    completed once they were training again (their step-end times, on the same clock)."""
    after = sorted(t for t in ends if fault < t < fault + window_s)
    before = [t for t in ends if t <= fault]
    if not after or not before:
        return None
    gaps = list(zip([before[-1], *after], after, strict=False))
    resumed = max(gaps, key=lambda gap: gap[1] - gap[0])[1]
    return round(resumed - fault, 3)


def _step_ends(times: Path, pid: int) -> list[float]:
    path = times / f"steps-{pid}.json"
    return [float(t) for t in json.loads(path.read_text())] if path.exists() else []


if __name__ == "__main__":
    import sys
    import tempfile

    with tempfile.TemporaryDirectory(prefix="unicron-torchft-") as tmp:
        print(json.dumps(torchft(Path(sys.argv[1]) if sys.argv[1:] else Path(tmp)), indent=2))

"""What the soak checks at the end: each task's final state against a failure-free run, its
sample ledger, and what the cluster left behind (processes, listening ports, file descriptors,
shared memory)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from bench.leftovers import processes_marked
from unicron.core.workerenv import host_checkpoint_dir
from unicron.train.checkpoint import load_latest
from unicron.train.data import DataStream

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "examples" / "tinygpt" / "train.py"
GLOBAL_BATCH, MICRO_BATCH, DATASET = 16, 2, 512
ARGS = ["--dtype", "float64", "--global-batch", str(GLOBAL_BATCH), "--micro-batch", str(MICRO_BATCH)]
ARGS += ["--dataset-size", str(DATASET)]


def reference(
    out: Path,
    iterations: int,
    extra: Sequence[str] = (),
    niced: bool = False,
    hold: int | None = None,
    env: Mapping[str, str] | None = None,
    started: Callable[[int], None] = lambda pid: None,
) -> dict[str, Any]:
    """The final checkpoint of the same training without failures, in one process (``extra``:
    more arguments of the example trainer; ``niced``: at the lowest CPU priority, to train beside
    a live cluster on the cycles it leaves; ``hold``: a file descriptor the training process
    keeps open, such as the lock on ``out``, held until it ends even if the caller ends first;
    ``env``: added to its environment, such as the worker contract's keys; ``started``: told the
    training process's pid, for its priority to be raised once someone waits for it)."""
    argv = [*ARGS, *extra, "--iterations", str(iterations), "--checkpoint-dir", str(out)]
    command = ["nice", "-n", "19"] * niced + [sys.executable, str(TRAIN), *argv]
    kept = () if hold is None else (hold,)
    environment = None if env is None else {**os.environ, **env}
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=kept, env=environment
    ) as training:  # (``nice`` runs the trainer in its own process: the pid is the trainer's)
        started(training.pid)
        try:
            output, errors = training.communicate(timeout=900)
        except subprocess.TimeoutExpired:
            training.kill()
            raise
    if training.returncode:
        raise subprocess.CalledProcessError(training.returncode, command, output, errors)
    state = load_latest(out)
    assert state is not None and state["step"] == iterations
    return state


def same_state(got: dict[str, Any] | None, want: dict[str, Any]) -> bool:
    """Parameters, optimizer moments and registered objects equal (float64, tight tolerance)."""
    if got is None or got["step"] != want["step"] or got["model"].keys() != want["model"].keys():
        return False
    try:
        for name in want["model"]:
            torch.testing.assert_close(got["model"][name], want["model"][name], rtol=1e-9, atol=1e-11)
        torch.testing.assert_close(
            got["optimizer"]["state"], want["optimizer"]["state"], rtol=1e-9, atol=1e-11
        )
    except AssertionError:
        return False
    return bool(got["extras"] == want["extras"])


@dataclass(frozen=True)
class Trained:
    """A training state's history, newest step first: ``step`` trained by ``generation`` on top
    of ``before`` (steps below it). Shared between the states that hold it, never copied."""

    step: int
    generation: int
    before: Trained | None


def upto(state: Trained | None, step: int) -> Trained | None:
    """``state`` as it was at ``step`` (what a checkpoint of that step holds)."""
    while state is not None and state.step > step:
        state = state.before
    return state


def surviving_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ledger lines whose training is in the final state, found by following each process's
    state through the trace: a step it trains goes on top of what it holds; a checkpoint of step
    R it resumes from holds what the newest training of step R held; a live replica's state it
    takes is that replica's (the rank named ``source`` in its generation), up to the step taken.
    The final state is that of the process that trained last; its steps name the generations
    whose lines count, so steps trained again from a checkpoint, or by a process that then took
    a newer state from a replica, are rolled back."""
    pid_of = {(r["generation"], r["rank"]): r["pid"] for r in rows if "rank" in r and "pid" in r}
    held: dict[int | None, Trained | None] = {}  # pid -> its state
    newest: dict[int, Trained] = {}  # step -> the state of its newest training
    last: int | None = None
    for r in rows:
        what, pid = r["what"], r.get("pid")
        if what == "samples":
            held[pid] = newest[r["step"]] = Trained(
                r["step"], r["generation"], upto(held.get(pid), r["step"] - 1)
            )
            last = pid
        elif what == "resumed":
            held[pid] = upto(newest.get(r["step"]), r["step"])
        elif what == "state_from_replica":
            source = pid_of.get((r["generation"], r.get("source")))
            taken = held.get(source) if source not in (None, pid) else newest.get(r["step"])
            held[pid] = upto(taken, r["step"])
    kept, state = set(), held.get(last)
    while state is not None:
        kept.add((state.generation, state.step))
        state = state.before
    return [r for r in rows if r["what"] == "samples" and (r["generation"], r["step"]) in kept]


@dataclass(frozen=True)
class Ledger:
    steps_exact: int  # steps whose recorded samples are exactly their global batch
    steps_short: int  # steps missing a share (a rank killed between its all-reduce and its line)
    wrong: list[str]  # steps with a sample twice, a foreign sample, or none recorded

    @property
    def ok(self) -> bool:
        return not self.wrong


def ledger(rows: list[dict[str, Any]], iterations: int) -> Ledger:
    steps: dict[int, Counter[int]] = {}
    for r in surviving_rows(rows):
        steps.setdefault(r["step"], Counter()).update(r["ids"])
    exact, short, wrong = 0, 0, []
    for step in range(1, iterations + 1):
        want, got = Counter(DataStream(GLOBAL_BATCH, MICRO_BATCH, DATASET, 0).batch(step)), steps.get(step)
        if got == want:
            exact += 1
        elif not got or got - want:
            wrong.append(f"step {step}: {'nothing recorded' if not got else 'a sample twice or foreign'}")
        else:
            short += 1
    return Ledger(exact, short, wrong)


# ------------------------------------------------------------------ leaks
def processes_of(root: Path) -> list[int]:
    """Processes started for the cluster under ``root``: the coordinator and agents name it on
    their command line, workers in their environment (their checkpoint folder)."""
    return processes_marked(str(root), exclude={os.getpid()})


def until(predicate: Callable[[], bool], timeout_s: float) -> bool:
    """Whether ``predicate`` came true within ``timeout_s`` (asked every 0.1 s)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


def open_fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def memory_folders(checkpoints: Path, tasks: Iterable[str], nodes: Iterable[str]) -> list[Path]:
    """The in-memory checkpoint folders (/dev/shm) of ``tasks`` whose persistent checkpoints
    are under ``checkpoints``, one per task (holding each node's)."""
    return [host_checkpoint_dir(checkpoints / task, node).parent for task in tasks for node in nodes]


def shared_memory(folders: Collection[Path] | None = None, pids: Collection[int] = ()) -> set[str]:
    """Files in /dev/shm (the in-memory checkpoint tier, torch's shared tensors); with
    ``folders``, only those under them or named after one of ``pids`` (e.g. ``torch_<pid>_...``)."""
    # os.walk, not Path.rglob: other runs' folders come and go meanwhile, and rglob raises on
    # one removed while it is read (seen: a soak failed on another test's freed checkpoint).
    found = {Path(top) / name for top, _, names in os.walk("/dev/shm") for name in names}
    if folders is not None:
        named = {str(pid) for pid in pids}
        found = {
            p
            for p in found
            if any(p.is_relative_to(f) for f in folders) or named & set(re.split(r"[_.-]", p.name))
        }
    return {str(p) for p in found}


def rows_of(trace: Path) -> list[dict[str, Any]]:
    """A JSON-lines trace, without a line still being written."""
    rows = []
    with contextlib.suppress(FileNotFoundError):
        for line in trace.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                rows.append(json.loads(line))
    return rows

"""torchft on this machine, for the benchmarks: a lighthouse and one torchrun job per replica
group (of one rank), running examples/torchft/train_torchft.py the way torchft's own examples
run theirs (https://github.com/pytorch/torchft: its train_ddp.py and README: each group a
torchrun job that restarts its worker, a lighthouse forming the quorums).

Everything is on loopback: the lighthouse binds 127.0.0.1, each group's torchrun hosts its own
store (``--standalone``), and the managers talk over the host name, which resolves to loopback
on these machines.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType

from bench.leftovers import processes_marked
from bench.torchrun import launcher
from unicron.control.launch.localcluster import free_port

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "torchft" / "train_torchft.py"
HSDP_SCRIPT = ROOT / "examples" / "torchft" / "train_torchft_hsdp.py"  # groups of several ranks
TIMER = ROOT / "bench" / "steptimes.py"
FAULTS = ROOT / "bench" / "torchft_faults.py"
START = ROOT / "bench" / "torchft_start.py"  # every group in the first quorum
# The managers' log lines (torchft's Rust manager, at INFO): a quorum and a commit vote.
QUORUM = re.compile(r"^(\S+) .*got lighthouse quorum")
QUORUM_ID = re.compile(r"quorum_id: (\d+)")
HEARTBEAT_TIMEOUT_S = 5.0  # the lighthouse's --heartbeat_timeout_ms default (torchft's own), as run here
COMMIT = re.compile(r"^(\S+) .*should_commit completed should_commit=(true|false)")


def lighthouse_binary() -> str:
    """The lighthouse that torchft's wheel installs beside the interpreter (``make venv``)."""
    found = shutil.which("torchft_lighthouse") or str(Path(sys.executable).with_name("torchft_lighthouse"))
    if not Path(found).exists():
        raise RuntimeError("torchft_lighthouse not found: run `make venv` (it installs torchft)")
    return found


class Groups:
    """A lighthouse and ``groups`` replica groups of ``ranks`` ranks (one: examples/torchft/
    train_torchft.py; more: its HSDP form) training with ``args``; ``restarts``: how often
    each group's torchrun restarts its worker (torchft relies on its launcher for that);
    ``faults``: a group's fault inside its worker (``ACTION@STEP``, ``bench/torchft_faults.py``),
    its injection time then in ``root/fault-<g>.json``. Each group writes its step times to
    ``root/times`` and its final state to ``root/final-<g>.pt``. Stopped on exit."""

    def __init__(
        self,
        root: Path,
        groups: int,
        args: Sequence[str],
        restarts: int = 0,
        min_replicas: int | None = None,
        heartbeat_timeout_ms: int = int(HEARTBEAT_TIMEOUT_S * 1000),
        faults: dict[int, str] | None = None,
        ranks: int = 1,
    ) -> None:
        self.root, self.groups, self.args, self.restarts = root, groups, list(args), restarts
        self.faults, self.ranks = faults or {}, ranks
        self.script = SCRIPT if ranks == 1 else HSDP_SCRIPT
        self.times = root / "times"
        self.times.mkdir(parents=True)
        self.port = free_port()
        # min_replicas: how many groups a quorum needs (all of them by default; one fewer lets
        # the survivors of one lost group go on without it). Every group is in the first quorum
        # either way, as torchrun starts every rank together: bench/torchft_start.py.
        needed = str(min_replicas or groups)
        beacon = [lighthouse_binary(), "--min_replicas", needed, "--bind", f"127.0.0.1:{self.port}"]
        beacon += ["--join_timeout_ms", "10000", "--heartbeat_timeout_ms", str(heartbeat_timeout_ms)]
        with (root / "lighthouse.log").open("wb") as log:
            self.lighthouse = subprocess.Popen(beacon, stdout=log, stderr=subprocess.STDOUT)
        self.jobs = [self._start(g) for g in range(groups)]

    def _start(self, group: int) -> subprocess.Popen[bytes]:
        env = {
            **os.environ,
            "OMP_NUM_THREADS": "1",
            "REPLICA_GROUP_ID": str(group),
            "NUM_REPLICA_GROUPS": str(self.groups),
            "TORCHFT_LIGHTHOUSE": f"http://127.0.0.1:{self.port}",
            "BENCH_START_DIR": str(self.root / "start"),
        }
        cmd = [*launcher(self.ranks), "--max-restarts", str(self.restarts), "--monitor-interval", "0.1"]
        cmd += [str(START)]
        if group in self.faults:
            env |= {"BENCH_FAULT": self.faults[group], "BENCH_FAULT_LOG": str(self.fault_log(group))}
            cmd += [str(FAULTS)]
        cmd += [str(TIMER), str(self.times), str(self.script), *self.args]
        cmd += ["--checkpoint", str(self.root / f"final-{group}.pt")]
        with self.log(group).open("wb") as log:
            return subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )

    def log(self, group: int) -> Path:
        return self.root / f"group-{group}.log"

    def fault_log(self, group: int) -> Path:
        return self.root / f"fault-{group}.json"

    def injected(self, group: int, wait_s: float = 300) -> dict[str, float]:
        """The group's fault as its worker logged it (``time``: wall clock, ``perf``: the
        step-time hook's clock), once it was injected."""
        deadline = time.monotonic() + wait_s
        while not (path := self.fault_log(group)).exists():
            if time.monotonic() > deadline or self.jobs[group].poll() is not None:
                raise RuntimeError(f"group {group}'s fault was never injected: see {self.log(group)}")
            time.sleep(0.02)
        logged: dict[str, float] = json.loads(path.read_text())
        return logged

    def commits(self, group: int) -> list[tuple[float, bool]]:
        """(wall-clock time, committed) of each commit vote the group's manager logged."""
        return [(_when(m[1]), m[2] == "true") for m in _lines(self.log(group), COMMIT)]

    def quorums(self, group: int) -> list[tuple[float, int, int]]:
        """(wall-clock time, quorum id, participants) of each quorum the group's manager got."""
        text = self.log(group).read_text(errors="replace") if self.log(group).exists() else ""
        return [
            (_when(line.split(" ", 1)[0]), int(ids[1]) if (ids := QUORUM_ID.search(line)) else -1, n)
            for line in text.splitlines()
            if QUORUM.match(line) and (n := line.count("QuorumMember {"))
        ]

    def worker(self, group: int, wait_s: float = 60) -> int:
        """The pid of the group's training process (torchrun's child, once it has started it)."""
        launcher, deadline = self.jobs[group].pid, time.monotonic() + wait_s
        while not (children := Path(f"/proc/{launcher}/task/{launcher}/children").read_text().split()):
            if time.monotonic() > deadline or self.jobs[group].poll() is not None:
                raise RuntimeError(f"group {group}'s torchrun started no worker: see {self.log(group)}")
            time.sleep(0.05)
        return int(children[0])

    def signal(self, group: int, sig: signal.Signals, launcher_too: bool = False) -> float:
        """Send ``sig`` to the group's worker (and its torchrun); returns the wall-clock time."""
        pids = [self.worker(group), *([self.jobs[group].pid] if launcher_too else [])]
        at = time.time()
        for pid in pids:
            os.kill(pid, sig)
        return at

    def wait(self, timeout_s: float = 900, groups: Sequence[int] | None = None) -> None:
        """Until the groups (all, or ``groups``) ended; a group that failed raises."""
        deadline = time.monotonic() + timeout_s
        for g in range(self.groups) if groups is None else groups:
            code = self.jobs[g].wait(timeout=max(1.0, deadline - time.monotonic()))
            if code != 0:
                raise RuntimeError(f"torchft replica group {g} exited {code}: see {self.log(g)}")

    def close(self) -> None:
        for job in [*self.jobs, self.lighthouse]:
            if job.poll() is None:
                if job is not self.lighthouse:
                    os.killpg(job.pid, signal.SIGKILL)  # the group's torchrun and its worker
                job.kill()
            job.wait()
        # A worker outside its torchrun's process group, stopped (a hang, a lost node: SIGSTOP)
        # or orphaned when its torchrun ended, outlived that kill (the benchmarks left such
        # workers stopped): every process naming this run's folder goes too.
        for pid in processes_marked(str(self.root), exclude={os.getpid()}):
            for sig in (signal.SIGCONT, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)

    def __enter__(self) -> Groups:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def run_groups(root: Path, groups: int, args: Sequence[str], timeout_s: float = 900, ranks: int = 1) -> Path:
    """Train with ``groups`` replica groups of ``ranks`` ranks (several: the HSDP script), without
    failures, until each has done its steps; returns the folder of their optimizer-step times
    (``bench/steptimes.py``)."""
    with Groups(root, groups, args, ranks=ranks) as running:
        running.wait(timeout_s)
        return running.times


def _lines(path: Path, pattern: re.Pattern[str]) -> list[re.Match[str]]:
    text = path.read_text(errors="replace") if path.exists() else ""
    return [m for m in map(pattern.match, text.splitlines()) if m]


def _when(stamp: str) -> float:
    """A manager log line's time (UTC, millisecond precision) as seconds since the epoch."""
    return datetime.fromisoformat(stamp).replace(tzinfo=UTC).timestamp()

"""Who ran on the workers' cores while a cell ran, and how long the workers' threads waited for
them (issue 12: why some runs are slow throughout).

On a lent machine's cores, two of five Unicron runs of a pinned pair were 16% and 39% slower
than the others all through the window, on either core set, while torchrun's side stayed within
2.6% (the session note of 2026-11-27). A run slow throughout on a core of its own is either
kept off that core (some other thread on it: the worker's threads wait in the run queue) or
slowed on it (the core itself, or its sibling, or memory). The kernel tells the two apart:
``/proc/PID/task/TID/schedstat`` holds each thread's time on a CPU and its time waiting in a run
queue, and ``/proc/PID/task/TID/stat`` the CPU it last ran on. A ``Census`` samples both every
``period`` seconds for the workers' threads, and, machine-wide, notes which other threads last
ran on a worker's core and how much CPU they used meanwhile (an approximation: a thread is
counted on the core it was last seen on).

It runs in the benchmark's own process (on the control cores), outside both sides' processes,
so it measures the two sides alike and changes neither.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PERIOD_S = 1.0
MAX_SAMPLES = 600  # bounded: a census of a cell that runs longer keeps its first 10 minutes


@dataclass(frozen=True)
class ThreadTimes:
    """One thread, as the kernel counts it: nanoseconds on a CPU and waiting in a run queue,
    the context switches it did not ask for, and the CPU it last ran on."""

    name: str
    run_ns: int
    wait_ns: int
    involuntary: int
    cpu: int


@dataclass(frozen=True)
class Sample:
    """One look: when (perf_counter), the workers found (pid -> run), the threads read ((pid,
    tid) -> times), and each worker's memory (pid -> kB by ``smaps_rollup`` field)."""

    time: float
    found: dict[int, str]
    threads: dict[tuple[int, int], ThreadTimes]
    memory: dict[int, dict[str, int]]


MEMORY_FIELDS = ("Rss", "AnonHugePages")  # huge pages: a run whose memory has none may be slower


def memory_of(pid: int) -> dict[str, int]:
    """The process's resident memory and how much of it is in transparent huge pages (kB)."""
    try:
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return {}
    fields = (line.split() for line in rollup.splitlines())
    return {f[0].rstrip(":"): int(f[1]) for f in fields if len(f) >= 2 and f[0].rstrip(":") in MEMORY_FIELDS}


def machine() -> dict[str, Any]:
    """What may make one run slower than another on the same cores: the transparent huge page
    policy, and which CPUs each NUMA node holds."""
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    nodes = sorted(Path("/sys/devices/system/node").glob("node[0-9]*"))
    return {
        "thp": thp.read_text().strip() if thp.is_file() else None,
        "numa": {n.name: (n / "cpulist").read_text().strip() for n in nodes if (n / "cpulist").is_file()},
    }


def thread_times(pid: int, tid: int) -> ThreadTimes | None:
    """The thread's times, or None where it has gone (or cannot be read)."""
    where = Path(f"/proc/{pid}/task/{tid}")
    try:
        run_ns, wait_ns, _ = (int(x) for x in (where / "schedstat").read_text().split())
        name, stat = (where / "stat").read_text().rsplit(") ", 1)
        status = (where / "status").read_text()
    except (OSError, ValueError):
        return None
    involuntary = next(
        (
            int(line.split()[1])
            for line in status.splitlines()
            if line.startswith("nonvoluntary_ctxt_switches")
        ),
        0,
    )
    # stat after the name: state is field 3, processor field 39 (proc(5)), so index 36 here.
    return ThreadTimes(name.split(" (", 1)[1], run_ns, wait_ns, involuntary, int(stat.split()[36]))


def threads_of(pid: int) -> dict[int, ThreadTimes]:
    found: dict[int, ThreadTimes] = {}
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            times = thread_times(pid, int(tid))
            if times is not None:
                found[int(tid)] = times
    return found


def every_thread() -> dict[tuple[int, int], ThreadTimes]:
    """Every thread on the machine (pid, tid) -> its times."""
    found: dict[tuple[int, int], ThreadTimes] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            found.update({(int(entry), tid): t for tid, t in threads_of(int(entry)).items()})
    return found


def command_of(pid: int) -> list[str]:
    """A process's command line: its arguments, or for one that set its title (a worker forked
    by its agent's fork server, ``control/agent/forkserver.py``) the title's words."""
    argv = [a for a in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0") if a]
    return argv[0].split(" ") if len(argv) == 1 else argv


def workers_under(root: Path) -> Callable[[], dict[int, str]]:
    """Finds the workers of the runs under ``root``: processes running ``bench/steptimes.py``
    (``python [OPTIONS] steptimes.py OUT ...``) whose output folder is there, each named by its
    run's folder relative to ``root``."""

    def find() -> dict[int, str]:
        found: dict[int, str] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                argv = command_of(int(entry))
            except OSError:
                continue
            # The interpreter runs the timer itself (only options before it): not a launcher
            # (torchrun) whose own arguments name it.
            script = next((i for i, a in enumerate(argv) if a.endswith("steptimes.py")), None)
            if (
                script is None
                or len(argv) <= script + 1
                or not all(a.startswith("-") for a in argv[1:script])
            ):
                continue
            if argv[script + 1].startswith(str(root)):
                found[int(entry)] = str(Path(argv[script + 1]).parent.relative_to(root))
        return found

    return find


class Census:
    """Samples the workers' threads (``find``: pid -> run) and the other threads on ``cores``
    (the workers' cores; none: unpinned, nobody else is counted) every ``period`` seconds, in a
    thread of its own, from entering to leaving; ``result`` then says what it saw."""

    def __init__(self, find: Callable[[], dict[int, str]], cores: Collection[int], period: float = PERIOD_S):
        self.find, self.cores, self.period = find, frozenset(cores), period
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="census", daemon=True)

    def __enter__(self) -> Census:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set() and len(self.samples) < MAX_SAMPLES:
            found = self.find()
            threads = every_thread() if self.cores else {k: x for p in found for k, x in _keyed(p).items()}
            memory = {pid: memory_of(pid) for pid in found}
            self.samples.append(Sample(time.perf_counter(), found, threads, memory))
            self._stop.wait(self.period)

    def result(self, window: tuple[float, float] | None = None) -> dict[str, Any]:
        """What the samples within ``window`` (perf_counter times: the step ends in
        ``bench/steptimes.py``'s records are on the same clock; None: all) saw. Per worker
        process: each thread's CPU and run-queue seconds between its first and last sighting,
        the CPUs its threads ran on, its involuntary context switches, its memory at the last
        sample (``MEMORY_FIELDS``), and a timeline of its busiest thread (time, cumulative
        seconds on a CPU and waiting). ``others``: the other threads seen on the workers' cores,
        by process and thread name, with the CPU seconds they used there. ``machine``: the huge
        page policy and the NUMA nodes' CPUs."""
        samples = [s for s in self.samples if window is None or window[0] <= s.time <= window[1]]
        workers: dict[int, str] = {}
        for sample in samples:
            workers.update(sample.found)
        return {
            "machine": machine(),
            "period_s": self.period,
            "window": list(window) if window else None,
            "cores": sorted(self.cores),
            "workers": {f"{run}/{pid}": _worker(samples, pid) for pid, run in sorted(workers.items())},
            "others": _others(samples, set(workers), self.cores),
        }


def summary(result: dict[str, Any]) -> str:
    """A census in short, a line per worker: its busiest thread's seconds on a CPU and waiting
    for one, the CPUs its threads ran on; then the other threads on the workers' cores."""
    lines = []
    for name, seen in result["workers"].items():
        if seen:
            _, ran, waited = max(seen["threads"].values(), key=lambda t: t[1])
            lines.append(f"  {name}: ran {ran:.2f} s, waited {waited:.2f} s, on cpus {seen['cpus']}")
    others = ", ".join(f"{n} {s:.2f} s" for n, s in list(result["others"].items())[:5])
    return "\n".join([*lines, f"  others on the workers' cores: {others or 'none'}"])


def _keyed(pid: int) -> dict[tuple[int, int], ThreadTimes]:
    return {(pid, tid): x for tid, x in threads_of(pid).items()}


def _worker(samples: list[Sample], pid: int) -> dict[str, Any]:
    seen = [(s.time, {tid: x for (p, tid), x in s.threads.items() if p == pid}) for s in samples]
    seen = [(t, threads) for t, threads in seen if threads]
    if not seen:
        return {}
    first: dict[int, ThreadTimes] = {}
    last: dict[int, ThreadTimes] = {}
    for _, threads in seen:
        for tid, x in threads.items():
            first.setdefault(tid, x)
            last[tid] = x
    used = {
        tid: (x.name, (x.run_ns - first[tid].run_ns) / 1e9, (x.wait_ns - first[tid].wait_ns) / 1e9)
        for tid, x in last.items()
    }
    busiest = max(used, key=lambda tid: used[tid][1])
    memory = [s.memory[pid] for s in samples if s.memory.get(pid)]
    return {
        "memory_kb": memory[-1] if memory else {},
        "seconds": round(seen[-1][0] - seen[0][0], 3),
        "threads": {str(tid): [n, round(r, 4), round(w, 4)] for tid, (n, r, w) in used.items()},
        "cpus": sorted({x.cpu for _, threads in seen for x in threads.values()}),
        "involuntary": sum(x.involuntary - first[tid].involuntary for tid, x in last.items()),
        "busiest": [
            [round(t, 3), round(threads[busiest].run_ns / 1e9, 4), round(threads[busiest].wait_ns / 1e9, 4)]
            for t, threads in seen
            if busiest in threads
        ],
    }


def _others(samples: list[Sample], workers: set[int], cores: frozenset[int]) -> dict[str, float]:
    """CPU seconds of other threads between two samples where both saw them and the later one
    last ran on a worker's core."""
    used: dict[str, float] = {}
    for before_sample, after_sample in itertools.pairwise(samples):
        before, after = before_sample.threads, after_sample.threads
        for key, x in after.items():
            if key[0] in workers or x.cpu not in cores or key not in before:
                continue
            name = f"{_process_name(after, key[0])}/{x.name}"
            used[name] = used.get(name, 0.0) + (x.run_ns - before[key].run_ns) / 1e9
    return {name: round(s, 4) for name, s in sorted(used.items(), key=lambda kv: -kv[1]) if s > 0}


def _process_name(threads: dict[tuple[int, int], ThreadTimes], pid: int) -> str:
    main = threads.get((pid, pid))
    return f"{main.name if main else '?'}[{pid}]"

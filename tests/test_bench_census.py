"""The census of the workers' cores (bench/census.py): a worker kept off its core by another
process is seen waiting, and the other process is named; the census finds a cell's workers."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.census import Census, workers_under

BUSY = "import time\nend = time.monotonic() + 30\nwhile time.monotonic() < end: pass"


def busy(core: int, argv: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, preexec_fn=lambda: os.sched_setaffinity(0, {core}))


def test_a_worker_sharing_its_core_is_seen_waiting_and_the_other_named() -> None:
    core = min(os.sched_getaffinity(0))
    worker = busy(core, [sys.executable, "-c", BUSY])
    other = busy(core, ["sh", "-c", "while :; do :; done"])  # a shell: its own name
    try:
        with Census(lambda: {worker.pid: "run-0"}, {core}, period=0.2) as census:
            time.sleep(2.0)
        seen = census.result()
    finally:
        for p in (worker, other):
            p.kill()
            p.wait()
    (only,) = seen["workers"].values()
    _, ran, waited = only["threads"][str(worker.pid)]
    # Two busy processes on one core: each runs about half the time and waits the other half
    # (less and more where the suite's other tests run there too: `make test` runs two at once).
    assert waited > 0.25 * only["seconds"] and ran > 0.05 * only["seconds"], only
    assert only["cpus"] == [core] and only["involuntary"] > 0
    assert only["memory_kb"]["Rss"] > 1000  # an interpreter's resident memory, in kB
    assert seen["others"].get(f"sh[{other.pid}]/sh", 0.0) > 0.05 * only["seconds"], seen["others"]
    first, last = only["busiest"][0], only["busiest"][-1]
    assert last[0] > first[0] and last[2] > first[2]  # the timeline: time, ran, waited (cumulative)
    # Within a window that ends before the second sample, one sample: nothing to difference.
    early = census.result(window=(0.0, census.samples[0].time))
    assert all(t[1:] == [0.0, 0.0] for w in early["workers"].values() for t in w["threads"].values())


def test_the_census_finds_the_workers_of_the_runs_under_its_folder(tmp_path: Path) -> None:
    times = tmp_path / "tinygpt-2-0-side" / "unicron" / "times"
    timer = tmp_path / "steptimes.py"  # a stand-in for bench/steptimes.py: it only sleeps
    timer.write_text("import time\ntime.sleep(30)\n")
    worker = [sys.executable, "-u", str(timer), str(times), "train.py"]
    # torchrun's launcher names the timer too, after its own arguments: not a worker
    launcher = [sys.executable, "-c", "import time; time.sleep(30)", str(timer), str(times)]
    elsewhere = [sys.executable, str(timer), "/elsewhere/times", "train.py"]
    procs = [subprocess.Popen(worker), subprocess.Popen(launcher), subprocess.Popen(elsewhere)]
    try:
        deadline = time.monotonic() + 10
        while (found := workers_under(tmp_path)()) == {} and time.monotonic() < deadline:
            time.sleep(0.05)
        assert found == {procs[0].pid: "tinygpt-2-0-side/unicron"}
    finally:
        for p in procs:
            p.kill()
            p.wait()


@pytest.fixture(autouse=True)
def _linux_only() -> None:
    if not Path("/proc/self/schedstat").exists():
        pytest.skip("the census reads the kernel's scheduler statistics (/proc/PID/schedstat)")

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import os
import resource
import shutil
import sys
import tempfile
from collections.abc import Generator, Iterable, Iterator
from pathlib import Path
from typing import Any, TextIO

import pytest

from bench.leftovers import RunGuard, listening_ports

from .fakecluster import make_cluster

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "data"  # published figures the package embeds (data/README.md)


@pytest.fixture
def examples() -> Path:
    return ROOT / "examples"


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Any]:
    """Build a coordinator stepped by hand (tests/fakecluster.py)."""
    yield from make_cluster(tmp_path)


GUARD = pytest.StashKey[RunGuard]()
OWN_PORTS = pytest.StashKey[set[int]]()  # a worker's: what it listened on as it started
WORKERS_LEFT = pytest.StashKey[list[str]]()  # the controller's: what the workers left listening
# The controller's: where the failure-free runs are, and its hold on them (none: its own folder).
REFERENCES = pytest.StashKey[tuple[Path, TextIO | None]]()
# Where the run's test processes share the failure-free runs they compare with
# (tests/test_live_cluster.py:shared_reference), set by the controlling process: in pytest's cache
# folder, under the digest of everything a run's numbers depend on (``reference_inputs``), so the
# next run trains only what changed; a run without the cache plugin trains them in a folder of
# its own, removed at its end.
REFERENCES_VARIABLE = "UNICRON_TEST_REFERENCES"


def inputs_digest(sources: Iterable[Path], *values: object) -> str:
    """The digest of what a failure-free run's final state depends on: the ``sources`` it runs
    (the trainer, its corpus drawn with numpy's generator, the library), ``values`` (its
    arguments), and torch's, numpy's and Python's versions. The key of the cached runs here and of
    the DDP originals (``test_ddp_port.py``)."""
    versions = [importlib.metadata.version(package) for package in ("torch", "numpy")]
    digest = hashlib.sha256(repr((versions, sys.version, values)).encode())
    for path in sources:
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def reference_inputs() -> str:
    """The digest of the example trainer's failure-free runs' inputs but their arguments."""
    trainer, library = ROOT / "examples" / "tinygpt", ROOT / "src" / "unicron"
    sources = sorted([*trainer.glob("*.py"), *library.rglob("*.py")])
    return inputs_digest([*sources, ROOT / "bench" / "chaos" / "check.py"])


IN_USE = "in-use"  # a run using a folder of failure-free runs holds a shared lock on this file in it


def references_folder(config: pytest.Config) -> tuple[Path, TextIO | None]:
    """This run's folder of failure-free runs, and the lock that says it is in use (held until
    the run ends: :func:`forget_references`). The cache's folders of other inputs are removed
    unless another run uses them (a run beside this one, of an older checkout)."""
    cache = getattr(config, "cache", None)
    if cache is None:
        return Path(tempfile.mkdtemp(prefix="unicron-references-")), None
    every = cache.mkdir("unicron-references")
    current = every / reference_inputs()
    current.mkdir(exist_ok=True)
    in_use = (current / IN_USE).open("a")
    fcntl.flock(in_use, fcntl.LOCK_SH)
    if not config.option.collectonly:  # (an editor's test discovery collects on every save)
        for other in every.iterdir():
            if other != current:
                remove_unused(other)
    return current, in_use


def remove_unused(folder: Path) -> bool:
    """Remove ``folder`` unless a run holds it in use; whether it was removed. Its lock is held
    while it is removed, so no run takes it up meanwhile."""
    with (folder / IN_USE).open("a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        shutil.rmtree(folder, ignore_errors=True)
        return True


# The files whose tests start processes and take longest (seconds each file took, measured in
# one serial run on 2 cores), longest first. `make test` runs the suite on three processes
# (pytest-xdist), each handed the next test in this order as it takes one up: the longest start
# first, and the run does not end waiting on a long test started last. Every other test keeps
# its place after them (a file missing here only runs later: nothing is left out).
LONGEST_FIRST = (
    "test_chaos.py",  # 78 s, in one test: the longest
    "test_live_hosts.py",  # 120
    "test_hf_llama.py",  # 200 in the parallel run of 2026-12-04 (two live recoveries, three torchruns)
    "test_live_hangs.py",  # 83
    "test_live_inprocess.py",  # 65
    "test_live_reconfigure.py",  # 49, in one test
    "test_live_detection.py",  # 44, in one test
    "test_live_sharded.py",  # 55
    "test_ddp_port.py",  # 50
    "test_live_storage.py",  # 50
    "test_slurm.py",  # 44
    "test_torchft_peer.py",  # 39
    "test_live_cluster.py",  # 32
    "test_live_split_brain.py",  # 30
    "test_live_failover.py",  # 27
    "test_live_escalation.py",  # 25
    "test_brain_properties.py",  # 26
    "test_api_fuzz.py",  # 24
    "test_live_drain.py",  # 22
    "test_live_observability.py",  # 21
    "test_live_tail.py",  # 20
    "test_live_replicas.py",  # 20
    "test_live_lagging_coordinator.py",  # 20
    "test_api_access.py",  # 19
    "test_live_stop.py",  # 18
    "test_live_store_tamper.py",  # 16
    "test_live_vanished.py",  # 16
    "test_readme_recipe.py",  # 15
    "test_live_spares.py",  # 15
    "test_torchrun_mode.py",  # 13
    "test_live_pace.py",  # 12
    "test_cluster_ports.py",  # 12
    "test_live_fallback.py",  # 11
    "test_bench_side_by_side.py",  # 11
    "test_install.py",  # 23 in the parallel run of 2026-12-04 (a wheel built, pip run)
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest files' tests first, in the order above (a stable sort keeps the rest)."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


CPU_STARTED = pytest.StashKey[float]()
CPU_PROPERTY = "cpu_s"
CPU_SHOWN = 15


def cpu_used_s() -> float:
    """CPU seconds used so far by this process and by the processes it has reaped (with theirs):
    a live test's CLI calls and reference runs; and by the servers it forks from, with the
    processes they reaped (and through those theirs): the template its clusters fork their agents'
    servers from, and the fork server its clusters fork their coordinators and agents from
    (``forked.py``), which this process reaps only when it ends."""
    own, reaped = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime + servers_cpu_s()


SERVERS = (b"unicron.control.agent.template", b"from multiprocessing.forkserver import main")
FOUND_SERVERS: set[int] = set()  # (found once: /proc is read again only until both are found)


def servers_cpu_s() -> float:
    """The CPU of this process's live servers (``SERVERS``) and their reaped children: utime,
    stime, cutime and cstime in /proc/PID/stat."""
    if len(FOUND_SERVERS) < len(SERVERS):
        FOUND_SERVERS.update(servers())
    total = 0.0
    for pid in list(FOUND_SERVERS):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended (a template that stopped serving is replaced)
            FOUND_SERVERS.discard(pid)
            continue
        total += sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    return total


def servers() -> list[int]:
    """This process's children that are ``SERVERS``."""
    found, me = [], os.getpid()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
                if parent == me and any(s in (proc / "cmdline").read_bytes() for s in SERVERS):
                    found.append(int(proc.name))
    return found


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[CPU_STARTED] = cpu_used_s()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    """The test's CPU (``cpu_used_s`` from its setup to its teardown) goes with its last report,
    to the process that prints the summary."""
    report = yield
    if call.when == "teardown" and CPU_STARTED in item.stash:
        report.user_properties.append((CPU_PROPERTY, cpu_used_s() - item.stash[CPU_STARTED]))
    return report


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The suite's CPU, and the tests that used most of it: the 2 cores are what bounds the
    suite's length (the live tests' workers compute or import torch while they wait), so this is
    where it is cut. A failure-free run trained in the background for later tests is counted
    against the test running meanwhile; a process not reaped by the test's (one left to an
    init process) is not counted."""
    used = [
        (dict(report.user_properties)[CPU_PROPERTY], report.nodeid)
        for reports in terminalreporter.stats.values()
        for report in reports
        if getattr(report, "when", None) == "teardown" and CPU_PROPERTY in dict(report.user_properties)
    ]
    if not used:
        return
    terminalreporter.write_sep(
        "=", f"CPU: {sum(s for s, _ in used):.0f} s in {len(used)} tests; the {CPU_SHOWN} that used most"
    )
    for seconds, nodeid in sorted(used, reverse=True)[:CPU_SHOWN]:
        terminalreporter.write_line(f"{seconds:8.1f}s cpu  {nodeid}")


def pytest_configure(config: pytest.Config) -> None:
    """Mark the run before any test starts a process (bench/leftovers.py): in the controlling
    process of a parallel run, whose mark the processes running the tests inherit (a worker of
    pytest-xdist has ``workerinput``), or in the one process of a serial run; and make the
    folder where they share the failure-free runs they compare with. A worker notes the ports
    it listens on as it starts."""
    if hasattr(config, "workerinput"):
        config.stash[OWN_PORTS] = listening_ports([os.getpid()])
    else:
        config.stash[GUARD] = RunGuard()
        config.stash[WORKERS_LEFT] = []
        config.stash[REFERENCES] = references_folder(config)
        os.environ[REFERENCES_VARIABLE] = str(config.stash[REFERENCES][0])


def forget_references(config: pytest.Config) -> None:
    """The run lets go of its folder of failure-free runs: the cache's is kept, its own removed."""
    os.environ.pop(REFERENCES_VARIABLE, None)
    folder, in_use = config.stash[REFERENCES]
    if in_use is None:
        shutil.rmtree(folder, ignore_errors=True)
    else:
        in_use.close()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """A worker of a parallel run ended: what it left listening, for the controller's check."""
    node.config.stash[WORKERS_LEFT] += getattr(node, "workeroutput", {}).get("left_listening", [])


@pytest.hookimpl(trylast=True)  # after pytest-xdist has ended the processes running the tests
def pytest_sessionfinish(session: pytest.Session) -> None:
    """Nothing outlives the run: a process, listening port or /dev/shm file left fails it. A
    session that only collected started nothing, and its check would take a run beside it for
    its own (it removed a live test's checkpoint file in /dev/shm mid-write once). A worker of a
    parallel run passes the ports it still listens on to the controlling process, which checks
    the whole run once the workers ended."""
    config = session.config
    if hasattr(config, "workerinput"):
        stop_references()
        left = sorted(listening_ports([os.getpid()]) - config.stash[OWN_PORTS])
        config.workeroutput["left_listening"] = [f"port {port} (in a test process)" for port in left]
        return
    if session.config.option.collectonly:
        forget_references(config)
        return
    stop_references()
    left = config.stash[GUARD].finish()
    forget_references(config)  # nothing trains there now
    lines = [*left.lines(), *(f"left listening: {p}" for p in config.stash[WORKERS_LEFT])]
    if not lines:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        print("\n".join(["the run left these behind (now ended):", *lines]))
    else:
        reporter.write_sep("=", "the run left these behind (now ended)", red=True)
        for line in lines:
            reporter.write_line(line, red=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


def stop_references() -> None:
    """Failure-free runs queued that no test waits for any more are not started: a worker of a
    parallel run is ended 10 s after its last test, and a run it left behind would be counted
    against the run. (One under way, seconds long, is waited for: a test that failed before it
    read its run is the only way to have one.)"""
    module = sys.modules.get("tests.test_live_cluster")  # (it imports this module: not imported here)
    if module is not None:
        module.TRAINER.shutdown(wait=False, cancel_futures=True)

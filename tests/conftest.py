from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
# Where the run's test processes share the failure-free runs they compare with
# (tests/test_live_cluster.py:shared_reference); made by the controlling process, removed at its end.
REFERENCES_VARIABLE = "UNICRON_TEST_REFERENCES"


# The files whose tests start processes and take longest (seconds each file took, measured in
# one serial run on 2 cores), longest first. `make test` runs the suite on two processes
# (pytest-xdist), each handed the next test in this order as it takes one up: the longest start
# first, and the run does not end waiting on a long test started last. Every other test keeps
# its place after them (a file missing here only runs later: nothing is left out).
LONGEST_FIRST = (
    "test_chaos.py",  # 78 s, in one test: the longest
    "test_live_hosts.py",  # 120
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
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest files' tests first, in the order above (a stable sort keeps the rest)."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


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
        os.environ[REFERENCES_VARIABLE] = tempfile.mkdtemp(prefix="unicron-references-")


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
        shutil.rmtree(os.environ.pop(REFERENCES_VARIABLE), ignore_errors=True)
        return
    stop_references()
    left = config.stash[GUARD].finish()
    shutil.rmtree(os.environ.pop(REFERENCES_VARIABLE), ignore_errors=True)  # nothing trains there now
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

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.leftovers import RunGuard

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


# The files whose tests start processes and take longest (seconds each file took, measured in
# one serial run on 2 cores), longest first. `make test` runs the suite on two processes
# (pytest-xdist), each handed the next test in this order as it is free: the longest start
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
    pytest-xdist has ``workerinput``), or in the one process of a serial run."""
    if not hasattr(config, "workerinput"):
        config.stash[GUARD] = RunGuard()


@pytest.hookimpl(trylast=True)  # after pytest-xdist has ended the processes running the tests
def pytest_sessionfinish(session: pytest.Session) -> None:
    """Nothing outlives the run: a process, listening port or /dev/shm file left fails it. A
    session that only collected started nothing, and its check would take a run beside it for
    its own (it removed a live test's checkpoint file in /dev/shm mid-write once). A worker of a
    parallel run checks nothing: the controlling process checks the whole run once they ended."""
    if session.config.option.collectonly or GUARD not in session.config.stash:
        return
    left = session.config.stash[GUARD].finish()
    if not left:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        print("\n".join(["the run left these behind (now ended):", *left.lines()]))
    else:
        reporter.write_sep("=", "the run left these behind (now ended)", red=True)
        for line in left.lines():
            reporter.write_line(line, red=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED

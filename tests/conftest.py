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


def pytest_configure(config: pytest.Config) -> None:
    """Mark the run before any test starts a process (bench/leftovers.py)."""
    config.stash[GUARD] = RunGuard()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Nothing outlives the run: a process, listening port or /dev/shm file left fails it. A
    session that only collected started nothing, and its check would take a run beside it for
    its own (it removed a live test's checkpoint file in /dev/shm mid-write once)."""
    if session.config.option.collectonly:
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

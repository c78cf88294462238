from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

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

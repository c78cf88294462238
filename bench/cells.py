"""Table cells for the generated docs, shared by the benchmarks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

NOT_MEASURED = "not measured"


def timing(entry: Mapping[str, Any] | None) -> str:
    """A latency entry: median / max of the measured runs, or the configured value."""
    if entry is None:
        return NOT_MEASURED
    if entry.get("measured") is False:
        return f"{entry['median_s']:.0f} s (configured)"
    return f"{entry['median_s']:.2f} / {entry['max_s']:.2f}"


def value(entry: Mapping[str, Any] | None, key: str) -> str:
    """One measured value of an entry."""
    if not entry or entry.get(key) is None:
        return NOT_MEASURED
    found = entry[key]
    return f"{found:.2f}" if isinstance(found, float) else str(found)

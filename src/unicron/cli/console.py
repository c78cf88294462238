"""The rich console the commands print to."""

from __future__ import annotations

import sys

from rich.console import Console


def console() -> Console:
    # Piped or captured output gets a wide page rather than rich's 80-column default, so tables
    # are not truncated in logs and files; a terminal keeps its own width.
    return Console() if sys.stdout.isatty() else Console(width=160)

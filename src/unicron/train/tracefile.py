"""A worker's trace: timestamped JSON lines in ``UNICRON_TRACE_FILE`` (measurements and tests
read what each rank did: the samples it trained on, where its state came from), or nothing."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any


class TraceFile:
    def __init__(self, path: str | None, who: Callable[[], dict[str, Any]]) -> None:
        self.path, self.who = path, who  # who: the worker's identity now (rank, generation, pid)

    def __call__(self, what: str, **detail: Any) -> None:
        """Append one line, if a trace file is set."""
        if self.path:
            line = {"time": time.time(), "what": what, **self.who(), **detail}
            with open(self.path, "a") as out:
                out.write(json.dumps(line) + "\n")

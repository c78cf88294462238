"""A worker's exit: the interpreter's last garbage collection skips what importing torch made
(docs/pytorch-notes.md, "Processes"), and nothing is frozen while the script still runs."""

from __future__ import annotations

import subprocess
import sys

# An exit handler registered before the library's runs after it (the last in runs first).
SCRIPT = """
import atexit, gc
atexit.register(lambda: print("frozen at exit:", gc.get_freeze_count() > 0))
import unicron.train as ut
for _ in range(2):  # (a second session in the process changes nothing)
    with ut.init(iterations=1) as session:
        pass
print("frozen after the sessions:", gc.get_freeze_count() > 0)
"""


def test_the_collector_is_frozen_at_exit_and_not_before() -> None:
    ran = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == ["frozen after the sessions: False", "frozen at exit: True"], ran.stdout

"""Checkpoint writes that the storage refuses do not stop training.

A checkpoint directory that fills up or turns read-only is the storage's fault, not the
worker's: restarting the worker cannot mend it, and every replica still holds the whole state in
memory (and the node's in-memory tier may still take copies). So a failed periodic save is
reported once (the coordinator opens a storage incident) and training goes on; the next due
checkpoint tries again, and the first one that the tier takes is reported too (the incident
closes). Only the final state must reach the storage: ``Persisting.final`` retries it until
``wait_s`` has passed, then raises, so that the task fails with the storage's reason rather than
ending with its result in memory only.

A checkpoint that its writer could not confirm as the task's current generation's
(``fencing.py``) is not a storage fault: it is skipped, and retried in the same way when it is
the final one; one whose writer was superseded ends the attempt (``CommitRefused`` is raised).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from unicron.core.protocol import StorageTier as Tier
from unicron.train.checkpoint import CheckpointWriteError
from unicron.train.fencing import CommitRefused, Standing

# (tier, ok, error, when): what the session sends its agent as a StorageReport.
Notify = Callable[[Tier, bool, str, float], None]


@dataclass
class Persisting:
    """The state of each checkpoint tier as this rank last found it: ``failing`` maps a tier
    that refused its last checkpoint to when it started refusing."""

    notify: Notify
    clock: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep
    failing: dict[Tier, float] = field(default_factory=dict)
    refused: Callable[[Tier, CommitRefused], None] = lambda tier, why: None  # a commit not confirmed

    def attempt(self, tier: Tier, write: Callable[[], Path]) -> Path | None:
        """Write one checkpoint to ``tier``; None when the storage refused it (reported when the
        tier starts refusing, and again when it takes a checkpoint again)."""
        try:
            path = write()
        except CheckpointWriteError as exc:
            if tier not in self.failing:
                self.failing[tier] = now = self.clock()
                self.notify(tier, False, str(exc), now)
            return None
        except CommitRefused as exc:
            self.refused(tier, exc)
            if exc.standing is Standing.SUPERSEDED:
                raise
            return None
        if self.failing.pop(tier, None) is not None:
            self.notify(tier, True, "", self.clock())
        return path

    def final(self, write: Callable[[], Path], wait_s: float, retry_s: float = 1.0) -> Path:
        """Write the final state to the persistent tier, retrying every ``retry_s`` while the
        storage refuses it (or the commit cannot be confirmed), for about ``wait_s``; then raise
        the storage's error (or ``CommitRefused``). A fixed number
        of tries, not a deadline: the ranks of a sharded replica write their parts together, so
        each must try as often as the others (their clocks differ)."""
        tries = max(0, math.ceil(wait_s / retry_s))
        for attempt in range(tries + 1):
            path = self.attempt("persistent", write)
            if path is not None:
                return path
            if attempt < tries:
                self.sleep(retry_s)
        return write()  # one last try: its CheckpointWriteError says why, as a storage fault

"""One optimizer step as the library sees it: its timing and micro-batches."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from unicron.core.protocol import IterationReport


@dataclass
class Iteration:
    """One step being timed; the loader records each micro-batch as its backward ends."""

    step: int
    micro_batches: int = 0  # how many the plan gave this rank (0: unknown)
    before_last: Callable[[], None] | None = None
    started: float = field(default_factory=time.perf_counter)
    samples: int = 0
    marks: list[float] = field(default_factory=list)
    recomputed: int = 0  # micro-batches computed for ranks that left the step
    # When computing (re)started (Unix time): the step's start, or when the group re-formed in it.
    resumed_at: float = field(default_factory=time.time)

    def record(self, samples: int) -> None:
        """Add a micro-batch of ``samples`` samples."""
        self.samples += samples
        self.marks.append(time.perf_counter())
        if self.before_last is not None and len(self.marks) == self.micro_batches - 1:
            self.before_last()

    def compute_s(self, ended: float) -> float:
        """The rank's own compute time. Only the last micro-batch's backward waits for peers (the
        gradient all-reduce), so the others' mean time stands in for it; with one micro-batch
        the whole step is all we know."""
        if len(self.marks) < 2:
            return ended - self.started
        own = self.marks[-2] - self.started
        return own * len(self.marks) / (len(self.marks) - 1)

    def report(self, task: str, generation: int, rank: int) -> IterationReport:
        """The step's report to the agent, as it ends now."""
        ended = time.perf_counter()
        return IterationReport(
            task=task,
            generation=generation,
            rank=rank,
            step=self.step,
            duration_s=ended - self.started,
            samples=self.samples,
            time=time.time(),
            compute_s=self.compute_s(ended),
            recomputed=self.recomputed,
            resumed_at=self.resumed_at,
        )


class PeerLostError(ConnectionError):
    """The coordinator declared a peer failed while this rank waited for it in a collective."""


class StopRequested(Exception):
    """This worker was asked to stop (SIGTERM) where it could not stop at a step boundary: while
    it waited for a membership, or with its step's collective broken under it by peers that took
    the same request a step boundary earlier. The step in progress is abandoned (nothing of it
    applied or recorded) and the worker stops at the last step it completed
    (``StepLoop.micro_batches``)."""

"""The reports waiting for the coordinator: what the node's workers and its supervision said,
held in order until a heartbeat carries them.

The supervision (``supervisor.py``) adds to it; the channel to the coordinator (``agent.py``)
takes the oldest in each heartbeat and drops them once a coordinator that knows the node answered
(one that does not read none: they go again after the registration). An urgent report (an exit, an
exception, a failed launch, stacks, an injected fault) wakes the channel to beat at once: an
injected fault's record is what detection times are measured from, and the fault (a hang, a node
lost with its agent) may otherwise take the record down with it before the next beat. While
the coordinator is unreachable the reports are kept, up to ``MAX_BUFFERED_REPORTS`` (the newest),
and sent in the heartbeats that follow one another at once when it answers again.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from unicron.core.limits import MAX_REPORTS_PER_BEAT
from unicron.core.protocol import (
    WORKER_REPORT,
    ExceptionReport,
    ExitReport,
    FaultReport,
    LaunchFailedReport,
    NumericalReport,
    StacksReport,
    WorkerReport,
)

MAX_BUFFERED_REPORTS = 10_000
# (A numerical fault's report: its generation may be re-formed within a heartbeat.)
URGENT = (ExitReport, ExceptionReport, LaunchFailedReport, StacksReport, FaultReport, NumericalReport)


@dataclass
class Backlog:
    reports: list[WorkerReport] = field(default_factory=list)
    urgent: asyncio.Event = field(default_factory=asyncio.Event)  # a report that must go at once

    def add(self, report: WorkerReport) -> None:
        self.reports.append(report)
        del self.reports[:-MAX_BUFFERED_REPORTS]
        if isinstance(report, URGENT):
            self.urgent.set()

    def batch(self, room: int) -> int:
        """How many of the oldest reports the next heartbeat carries (``batch_size``)."""
        return batch_size(self.reports, room)

    def drop_oldest(self) -> WorkerReport:
        """Let the oldest go unsent (one too large for any heartbeat: none is, ``batch_size``)."""
        return self.reports.pop(0)

    def sent(self, count: int) -> None:
        """The oldest ``count`` reached the coordinator."""
        del self.reports[:count]

    def exits_waiting(self) -> set[tuple[str, int, int]]:
        """The workers (task, generation, rank) whose exits have not reached the coordinator."""
        return {(r.task, r.generation, r.rank) for r in self.reports if isinstance(r, ExitReport)}


def batch_size(reports: list[WorkerReport], room: int) -> int:
    """How many of the oldest ``reports`` one heartbeat carries: at most MAX_REPORTS_PER_BEAT, in
    ``room`` bytes of JSON (the body's limit less the rest of the heartbeat). Each report's texts
    are bounded (``core/protocol.py``), the largest a stacks report of MAX_STACKS_CHARS, so one
    always fits beside the longest list of workers."""
    size = 0
    for count, report in enumerate(reports[:MAX_REPORTS_PER_BEAT]):
        size += len(WORKER_REPORT.dump_json(report)) + 1  # (and a comma)
        if size > room:
            return count
    return min(len(reports), MAX_REPORTS_PER_BEAT)

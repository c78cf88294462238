"""Which rank hung, and where: pure judgements over the workers' reported positions and stacks.

When a step is late every rank looks the same from outside: it has not finished. The ranks that
wait inside a collective are waiting for someone; the culprit is the rank that is not there,
whether its process is stopped, looping or sleeping in its forward pass, or stuck before the
collective. The stacks the workers dump on request (faulthandler) say where each one is.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from unicron.brain.records import WorkerRecord
from unicron.core.protocol import WAITING_PHASES, Phase, Progress

WorkerKey = tuple[str, int, int]


@dataclass(frozen=True)
class HangVerdict:
    culprits: list[WorkerRecord]  # empty: the culprit could not be told apart
    why: str
    where: dict[int, str] = field(default_factory=dict)  # rank -> its last reported position
    held_s: dict[int, float] = field(default_factory=dict)  # rank -> how long it was there when read
    # A launch stuck starting up: ranks that never reached their training session, the others
    # waiting for them (not the network's, and a membership posted in place reaches none of them).
    starting: bool = False


@dataclass(frozen=True)
class NotYet:
    """A late step not judged yet, and why: a node of the task is silent (whether it is lost is
    decided first), or the ranks outside the collective were read there too soon after they got
    there to be blamed (the node's next heartbeat may find them inside)."""

    why: str
    silent_s: dict[str, float] = field(default_factory=dict)  # node -> how long it has been silent


@dataclass(frozen=True, slots=True)
class Sighting:
    """A worker as its agent last read it: whether its process is stopped, its position, and how
    long it had held that position when read (the node's own clock: the heartbeat's send time
    minus the position's; None: not known)."""

    stopped: bool = False
    at: Progress | None = None
    held_s: float | None = None


def position(progress: Progress | None) -> str:
    """A reported position in words, e.g. "step 12: compute (micro-batch 3)"."""
    if progress is None:
        return "no position reported"
    what = f" {progress.what}" if progress.what else ""
    batch = f" (micro-batch {progress.micro_batch})" if progress.phase is Phase.COMPUTE else ""
    return f"step {progress.step}: {progress.phase.value}{what}{batch}"


def unheard(
    workers: Sequence[WorkerRecord], last_seen: Mapping[str, float], now: float, interval_s: float
) -> dict[str, float]:
    """The task's nodes not heard for two heartbeat intervals (``interval_s``: the agents' now,
    ``core/cadence.py``), with how long: while any is, a late step is not judged (``hang_verdict``)."""
    silence = {h: now - last_seen[h] for h in sorted({w.node for w in workers}) if h in last_seen}
    return {h: s for h, s in silence.items() if s > 2 * interval_s}


def hang_verdict(
    workers: Sequence[WorkerRecord],
    last_seen: Mapping[str, float],
    seen: Mapping[WorkerKey, Sighting],
    now: float,
    interval_s: float,
    settled_s: float = 0.0,
    launching: bool = False,
    capped: bool = False,
) -> HangVerdict | NotYet:
    """For a task whose step is late: the hung ranks, or not yet while a node of the task is
    silent. A stopped process is a culprit; else the ranks that are not waiting (in a collective,
    or for a membership) while others are, and have not gone past the oldest step a rank waits in
    a collective for, once read holding that position for ``settled_s`` (``detection.settled_for``:
    nearly the whole deadline): a position read just after a move is a heartbeat old when judged,
    more when the node's link retransmits (10% of packets lost: a rank blamed for the micro-batch
    it had left for the collective, its process restarted). ``launching``: the step is a launch's
    first, whose ranks that never reached their session are stuck starting up. With no rank
    waiting, the step is hung once every rank was read where it is for ``settled_s``, or once it
    is ``capped`` (it waited ``hang_cap_s``: hung however its ranks move)."""
    if silent := unheard(workers, last_seen, now, interval_s):
        return NotYet("a node of the task is silent: its loss is decided first", silent)
    sightings = {w.key: seen.get(w.key, Sighting()) for w in workers}
    where = {w.rank: position(sightings[w.key].at) for w in workers}
    held = {w.rank: h for w in workers if (h := sightings[w.key].held_s) is not None}
    halted = [w for w in workers if sightings[w.key].stopped]
    if halted:
        return HangVerdict(halted, "its process is stopped (SIGSTOP or traced)", where, held)
    reported = [(w, p, sightings[w.key].held_s) for w in workers if (p := sightings[w.key].at) is not None]
    unstarted = [w.rank for w in workers if sightings[w.key].at is None]
    if launching and unstarted and all(p.phase in WAITING_PHASES for _, p, _ in reported):
        # The ranks that report wait (to join, or in the first collective) for those that never
        # reached the session: stuck importing or loading, no network's stall.
        why = f"rank(s) {unstarted} have not reached the training session: stuck starting up"
        return HangVerdict([], why, where, held, starting=True)
    if not reported:
        return HangVerdict([], "no rank reports its position: no rank can be blamed", where, held)
    if not any(p.phase in WAITING_PHASES for _, p, _ in reported):
        # Every rank outside a collective: hung there only once none has moved for ``settled_s``
        # (its position changes each micro-batch). One read there sooner is still training, a
        # slow step on a loaded host; the next heartbeat finds it in a collective (its peers'
        # culprit is then told apart) or settled.
        moving = [w for w, _, there_s in reported if there_s is not None and there_s < settled_s]
        if moving and len(reported) == len(workers) and not capped:
            brief = ", ".join(f"{w.rank} ({held[w.rank]:.2f} s)" for w in moving)
            return NotYet(
                f"no rank waits in a collective, and rank(s) read moving under {settled_s:.2f} s ago: {brief}"
            )
        return HangVerdict([], "no rank waits, in a collective or to join: none to blame", where, held)
    # A rank past the oldest step a peer waits in a collective for has left that collective: the
    # peer still in it waits on the network (a slow ring's last hops), not on that rank. (A
    # newcomer waiting for a membership has no step of the task's yet: it bounds nothing.)
    oldest = min((p.step for _, p, _ in reported if p.phase is Phase.COLLECTIVE), default=None)
    behind = [
        (w, there_s)
        for w, p, there_s in reported
        if p.phase not in WAITING_PHASES and (oldest is None or p.step <= oldest)
    ]
    settled = [w for w, there_s in behind if there_s is None or there_s >= settled_s]
    if settled:
        return HangVerdict(settled, "not in the collective its peers wait in", where, held)
    if behind:
        brief = ", ".join(f"{w.rank} ({held[w.rank]:.2f} s)" for w, _ in behind)
        return NotYet(
            f"rank(s) outside the collective read there under {settled_s:.2f} s after they got there: {brief}"
        )
    return HangVerdict([], "every rank waits in a collective or is past it: none to blame", where, held)


def trained_past(
    workers: Sequence[WorkerRecord], progress: Mapping[WorkerKey, Progress | None], generation: int
) -> int | None:
    """The last step every rank of ``generation`` has ended, by where each reports it is (a rank
    training step s has ended s - 1); None if a rank reports no position in it. A step the
    coordinator waits for that every rank is past has ended: its report was lost (a coordinator
    that started over had not stored its predecessor's last steps) or is on its way, and it is
    no hang."""
    at = [p.step for w in workers if (p := progress.get(w.key)) is not None and p.generation == generation]
    return min(at) - 1 if workers and len(at) == len(workers) else None


def not_arrived(
    workers: Sequence[WorkerRecord], progress: Mapping[WorkerKey, Progress | None], generation: int
) -> list[WorkerRecord]:
    """Members of a re-formed ``generation`` that have not reached it (their last position is
    from an older generation, or they reported none): those an in-process recovery waits for."""
    return [w for w in workers if (p := progress.get(w.key)) is None or p.generation < generation]


_THREAD = re.compile(r"^(?:Current thread|Thread) 0x[0-9a-f]+", re.MULTILINE)
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)', re.MULTILINE)
# py-spy: "Thread 4242 (idle): "MainThread"" then "    func (path/file.py:12)" per frame.
_SPY_THREAD = re.compile(r"^Thread \d+", re.MULTILINE)
_SPY_FRAME = re.compile(r"^\s+(?P<func>\S+) \((?P<file>[^)]+):(?P<line>\d+)\)$", re.MULTILINE)


def innermost_frame(stack: str) -> str | None:
    """Where the main thread is, from a faulthandler dump or a py-spy dump (both most recent call
    first): the innermost frame of the thread that runs a module's code (the script's main
    thread; under ``python -m``, runpy's frames lie below the module's)."""
    for thread, frame in ((_THREAD, _FRAME), (_SPY_THREAD, _SPY_FRAME)):
        starts = [m.start() for m in thread.finditer(stack)] + [len(stack)]
        for begin, end in itertools.pairwise(starts):
            frames = list(frame.finditer(stack, begin, end))
            if any(f["func"] == "<module>" for f in frames):
                top = frames[0]
                return f"{top['func']} ({top['file'].rsplit('/', 1)[-1]}:{top['line']})"
    return None

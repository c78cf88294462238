"""Whose fault is a silence: the coordinator's own lateness, a mass silence, or the nodes'.

A node is lost when it has not been heard for ``heartbeat_deadline_s``. Two things besides a
dead node make a node unheard, and neither may cost healthy nodes (each loss shrinks or restarts
the training tasks on it):

- **The coordinator is late.** Its loop reads heartbeats and ticks on one thread: while it is
  busy (a burst of heartbeats at scale, a slow request, a loaded host, a collector's pause) the
  heartbeats wait in its sockets, and the nodes look silent for as long. ``Lateness`` keeps how
  late the coordinator is: the later of how late its loop came to a tick (measured by the
  service's loop: ``service.py``) and how long the heartbeats it reads waited (``BeatDelays``,
  from the time each agent says it sent one, capped at one heartbeat deadline), and a node's
  silence is counted without the most the coordinator was late since the node was last heard:
  a deadline stretches by the coordinator's own lag, and a node that really stopped is found
  within the deadline plus that lag. (A stall longer than two heartbeat intervals is a pause,
  handled as one: ``nodewatch.stalled_for``.)
- **The coordinator is far behind.** Its lag (the heartbeats' waits, above) stretches a deadline
  by at most one deadline, so that nobody can hide a dead node for long; a coordinator so loaded
  that its heartbeats wait that long or longer (thousands of agents on a host it shares, a burst
  of recoveries) would still blame nodes whose requests it never read (2,048 agents every 0.5 s
  here: dozens of healthy nodes lost). So while the lag is at its cap, the silent nodes are held
  as in a mass silence (the alarm says why), for at most ``mass_silence_hold_s``; it has caught
  up once the lag is under ``CAUGHT_UP_SHARE`` of a deadline (a lag hovering at the cap would
  otherwise end and raise the hold again and again), and those still silent then get a
  restart's grace (their agents' requests timed out, and they back off).
- **Many nodes fall silent at once.** A switch, the coordinator's own network, or its host
  failed, more likely than most of the nodes at once. As Kubernetes' node lifecycle controller
  does (``--unhealthy-zone-threshold`` 0.55 with more than two nodes unhealthy: a partial
  disruption; all of a zone: a full one), when more than ``mass_silence_share`` of the nodes
  in service (at least ``mass_silence_min_nodes``), or every one of them, are silent at once, no
  node is declared lost: an alarm is raised (``mass_silence``), and nodes are judged one by one
  again once heartbeats come back, or once the silence has lasted ``mass_silence_hold_s`` (a
  silence that long is taken as real: the tasks cannot train anyway).
- **A silence rising across the cluster is judged as the mass silence it becomes.** Nodes that
  went quiet together (a switch failing port by port, a swamped coordinator or network) pass
  their deadline over a second or two, not at once: judged on the first sweep, the few past it
  would be lost (a loss rate's burst of them, seen so past the scale bench's cliff) before the
  share crossed the threshold. So the
  share also counts the nodes *quiet*, unheard for ``QUIET_SHARE`` of a deadline less the
  coordinator's lateness (two missed heartbeats and more: a healthy node is heard every
  interval; with a deadline of fewer than four intervals, at least ``QUIET_INTERVALS``, and no
  quiet count where that reaches the deadline): when more than ``mass_silence_share`` of the
  nodes in service (at least ``mass_silence_min_nodes``) are quiet, a node past its deadline is
  held as in a mass silence. ("All of them", which makes a mass silence of two silent nodes in a
  cluster of two, is not applied to the quiet count: one dead node and one whose heartbeat is
  late would be all of it.) Such an alarm, raised on the quiet count alone, gives no restart's
  grace when it ends: the cluster was being heard, and a node still silent is judged at once.
  The count is the whole cluster's: a failure domain is judged by its nodes past their deadline.
- **A failure domain partly silent is held too.** Nodes may name the domain they share (a rack, a
  leaf switch, a power feed: the agent's ``--domain``). As Kubernetes judges each zone: when more
  than ``mass_silence_share`` of a domain's nodes in service (at least ``mass_silence_min_nodes``),
  but not all, are silent at once, the domain's switch or uplink is flapping more likely than most
  of its nodes died: its silent nodes are held (a ``domain_silence`` alarm, per domain) until
  they are heard, or for ``mass_silence_hold_s``; nodes still silent when the others came back
  get a restart's grace (their agents may be backing off). A whole domain silent while the rest of
  the cluster beats is a real outage (its switch, its power): its nodes are judged as usual.
- **An admin may hold every loss by hand** (``unicron node hold-losses``, say through a planned
  change of the network), until released; the hold outlives a coordinator's restart.
- **Losses acted on are rate limited** (Kubernetes' ``--node-eviction-rate``): a bucket of
  ``node_loss_burst`` losses refilled at ``node_loss_rate_per_s``. A rack's worth is declared at
  once; a coordinator that misjudges a large cluster takes its nodes away slowly, not all in a
  few seconds.

Pure: the verdict is a function of the silent nodes, the count in service, the time and this
module's own state; the detector reads the store and carries the verdict out.
"""

from __future__ import annotations

import bisect
import collections
from collections.abc import Mapping
from dataclasses import dataclass, field

from unicron.core.settings import Settings

QUIET_SHARE = 0.5  # of a deadline unheard (less the coordinator's lateness): a node is quiet
QUIET_INTERVALS = 2.0  # ... and at least this many heartbeat intervals (two missed beats)
BEHIND_SHARE = 1.0  # a heartbeat lag of this share of a deadline (its cap): the coordinator is behind
CAUGHT_UP_SHARE = 0.5  # ... and it has caught up once the lag is under this share (not at the cap's edge)
MASS, BEHIND = "mass silence", "coordinator behind"  # why the alarm holds the losses


@dataclass
class Lateness:
    """How late the coordinator's loop came to its ticks: the longest it was late since a given
    time, for ``window_s``. Heartbeats wait in the sockets while the loop is busy, so the longest
    wait since a node was last heard is how much of its silence was the coordinator's.

    Kept as marks whose lateness decreases from the oldest to the newest: a mark followed by a
    later, longer one is never the longest of a window reaching to now, so it is dropped. The
    longest since ``then`` is then the first mark after it: O(log n)."""

    window_s: float
    times: list[float] = field(default_factory=list)  # coordinator clock, increasing
    lates: list[float] = field(default_factory=list)  # decreasing

    def add(self, now: float, late_s: float) -> None:
        """The loop came ``late_s`` later than planned to its tick at ``now``."""
        if late_s <= 0:
            return
        while self.lates and self.lates[-1] <= late_s:
            self.times.pop()
            self.lates.pop()
        self.times.append(now)
        self.lates.append(late_s)
        drop = bisect.bisect_left(self.times, now - self.window_s)
        if drop:
            del self.times[:drop], self.lates[:drop]

    def since(self, then: float) -> float:
        """The longest the loop was late after ``then`` (within the window)."""
        at = bisect.bisect_right(self.times, then)
        return self.lates[at] if at < len(self.lates) else 0.0


QUANTILE = 0.9  # across nodes, of the waits their heartbeats tell of: how far behind the coordinator is


@dataclass
class BeatDelays:
    """How long heartbeats waited before the coordinator read them. Each heartbeat says when its
    agent sent it; its delay (read time minus that) above the least its node's showed in the last
    ``floor_kept_s`` (which holds the node's clock offset and its network's floor) is time it
    spent in the coordinator's sockets; and an agent whose requests timed out unanswered in the
    coordinator's backlog says, when one is read, how long it has had no answer. Each node's
    latest such wait, read within ``window_s``, counts once: their ``QUANTILE`` across nodes is
    how far behind the coordinator is, a backlog that a tick's own lateness does not show
    (heartbeats wait in sockets, not on the loop), and starved nodes. Bounded so that nobody can
    hide a dead node for long: one node counts once (its agent's token, or its clock stepped back,
    cannot set the lag where other nodes say otherwise), each wait counts at most ``cap_s``, and a
    node's first heartbeat (after a registration, or this coordinator's start) sets its floor only
    (its agent's wait then is a restart's or a takeover's, which have their own grace)."""

    cap_s: float
    window_s: float
    floor_kept_s: float = 600.0
    floors: dict[str, tuple[float, float]] = field(default_factory=dict)  # node -> (least, since)
    latest: dict[str, tuple[float, float]] = field(default_factory=dict)  # node -> (wait, read at)

    def heard(self, node: str, delay_s: float, unanswered_s: float, now: float) -> None:
        """A heartbeat of ``node`` read ``delay_s`` after it was sent (by the two clocks), whose
        agent had had no answer for ``unanswered_s`` beyond its heartbeat interval."""
        first = node not in self.floors
        floor, since = self.floors.get(node, (delay_s, now))
        if delay_s < floor or now - since > self.floor_kept_s:
            floor, since = delay_s, now
        self.floors[node] = (floor, since)
        wait = 0.0 if first else max(delay_s - floor, unanswered_s)
        self.latest[node] = (min(self.cap_s, max(0.0, wait)), now)

    def lag(self, now: float) -> float:
        recent = sorted(wait for wait, at in self.latest.values() if now - at <= self.window_s)
        return recent[int(QUANTILE * (len(recent) - 1))] if recent else 0.0

    def forget(self, node: str) -> None:
        """The node registered again (or was removed): its floor and its wait go."""
        self.floors.pop(node, None)
        self.latest.pop(node, None)

    def clear(self) -> None:
        """The coordinator stalled: what was read before says nothing of it now (a stall has a
        grace of its own)."""
        self.latest.clear()


@dataclass(frozen=True)
class Verdict:
    """What to do about the nodes silent past their deadline now."""

    lost: list[tuple[str, float]]  # declare these lost (name, how long silent)
    held: list[str]  # silent, but not declared: a mass silence, or the loss rate
    alarm_began: bool = False  # a mass silence began now
    alarm_ended: float | None = None  # a mass silence ended now, after this many seconds
    alarm_why: str | None = None  # while the alarm holds: MASS or BEHIND
    grace: bool = True  # an alarm that ended: the nodes still silent get a restart's grace
    # Domains partly silent from now (domain, silent, in service), and those heard again now
    # (domain, after how many seconds).
    domains_began: tuple[tuple[str, int, int], ...] = ()
    domains_ended: tuple[tuple[str, float], ...] = ()
    domains_held: frozenset[str] = frozenset()  # the domains whose silent nodes are held now
    alarm_holds: bool = False  # the alarm holds every loss now (raised, and not past its hold)


@dataclass
class SilenceJudge:
    """The judge's state: the alarm, if raised, and the loss bucket."""

    limits: Settings
    by_hand: bool = False  # an admin holds every loss (``unicron node hold-losses``)
    alarm_since: float | None = None
    alarm_why: str | None = None  # MASS, or BEHIND (the coordinator's heartbeat lag)
    alarm_rising: bool = False  # raised on the quiet count alone, and only so since (``judge``)
    tokens: float = -1.0  # losses that may be declared now (filled at the first verdict)
    filled_at: float = 0.0
    domain_alarms: dict[str, float] = field(default_factory=dict)  # domain -> partly silent since
    domain_grace: dict[str, float] = field(default_factory=dict)  # domain -> its nodes held until

    def _mass(self, silent: int, in_service: int) -> bool:
        """More than the share of at least the least number, or all of them (two or more)."""
        return silent >= 2 and (silent == in_service or self._share(silent, in_service))

    def _share(self, count: int, in_service: int) -> bool:
        limits = self.limits
        return count >= limits.mass_silence_min_nodes and count > limits.mass_silence_share * in_service

    def judge(
        self,
        silent: list[tuple[str, float]],
        in_service: int,
        now: float,
        domains: Mapping[str, str] | None = None,
        grace_s: float = 0.0,
        behind: bool = False,
        quiet: int = 0,
        members: Mapping[str, int] | None = None,
    ) -> Verdict:
        """``silent``: nodes past their deadline (not yet lost); ``in_service``: nodes not lost;
        ``domains``: the failure domain of each node in service that named one; ``grace_s``: how
        long the nodes of a domain heard again may still be silent (a restart's grace);
        ``behind``: the coordinator's heartbeat lag is ``BEHIND_SHARE`` of a deadline or more;
        ``quiet``: the nodes in service unheard for ``QUIET_SHARE`` of a deadline (a rising
        silence), ``silent`` among them; ``members``: how many nodes in service each domain has
        (counted from ``domains`` when not given)."""
        limits = self.limits
        counted = self._mass(len(silent), in_service)
        rising = not counted and not behind and bool(silent) and self._share(quiet, in_service)
        mass = counted or rising or (behind and bool(silent))
        if mass:
            self.alarm_why = MASS if counted or rising else BEHIND
        began, ended = False, None
        if mass and self.alarm_since is None:
            self.alarm_since, began, self.alarm_rising = now, True, rising
        elif mass:
            self.alarm_rising = self.alarm_rising and rising
        elif self.alarm_since is not None:
            ended, self.alarm_since = now - self.alarm_since, None
        holding = self.alarm_since is not None and now - self.alarm_since < limits.mass_silence_hold_s
        part = self._domains(silent, domains or {}, now, grace_s, members)
        if holding or self.by_hand or ended is not None:  # (ended: the detector may give a grace)
            held = [name for name, _ in silent]
            grace = ended is None or not self.alarm_rising
            return Verdict([], held, began, ended, self._why(), grace, *part, alarm_holds=holding)
        held = [name for name, _ in silent if (domains or {}).get(name) in part[2]]
        judged = [s for s in silent if (domains or {}).get(s[0]) not in part[2]]
        self._refill(now)
        ordered = sorted(judged, key=lambda s: -s[1])  # the longest silent first
        take = min(len(ordered), int(self.tokens))
        self.tokens -= take
        lost, rest = ordered[:take], [name for name, _ in ordered[take:]]
        return Verdict(lost, held + rest, began, ended, self._why(), True, *part)

    def _why(self) -> str | None:
        return self.alarm_why if self.alarm_since is not None else None

    def _domains(
        self,
        silent: list[tuple[str, float]],
        domains: Mapping[str, str],
        now: float,
        grace_s: float,
        members: Mapping[str, int] | None = None,
    ) -> tuple[tuple[tuple[str, int, int], ...], tuple[tuple[str, float], ...], frozenset[str]]:
        """The domains partly silent now (their alarms begun and ended) and the domains whose
        silent nodes are held: partly silent for less than ``mass_silence_hold_s``, or heard
        again less than ``grace_s`` ago."""
        members = collections.Counter(domains.values() if members is None else members)
        quiet = collections.Counter(domains[name] for name, _ in silent if name in domains)
        partly = {d for d, n in quiet.items() if n < members[d] and self._mass(n, members[d])}
        began = tuple((d, quiet[d], members[d]) for d in sorted(partly - set(self.domain_alarms)))
        for d, _, _ in began:
            self.domain_alarms[d] = now
        ended = tuple((d, now - t) for d, t in sorted(self.domain_alarms.items()) if d not in partly)
        hold_s = self.limits.mass_silence_hold_s
        for d, seconds in ended:
            del self.domain_alarms[d]
            # Heard again: a grace for those still silent. Not when all of it is silent now (a
            # real outage), nor when its hold ran out and its silent nodes were taken as lost.
            if quiet[d] < members[d] and seconds < hold_s:
                self.domain_grace[d] = now + grace_s
        self.domain_grace = {d: until for d, until in self.domain_grace.items() if until > now}
        held = {d for d, t in self.domain_alarms.items() if now - t < hold_s} | set(self.domain_grace)
        return began, ended, frozenset(held)

    def _refill(self, now: float) -> None:
        burst = float(self.limits.node_loss_burst)
        if self.tokens < 0:
            self.tokens, self.filled_at = burst, now
        self.tokens = min(burst, self.tokens + (now - self.filled_at) * self.limits.node_loss_rate_per_s)
        self.filled_at = now

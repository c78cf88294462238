"""Which nodes are silent, and whose fault a silence is: the sweep that declares nodes lost.

Each heartbeat read says when its node was last heard (``Coordinator.heartbeat``); a few times an
interval the nodes are looked over (``NodeWatch.silent``): a node silent past the cluster's
deadline (``core/cadence.py``), the coordinator's own lateness not counted against it, is lost,
unless the silence is a mass silence, a failure domain's partial silence, an admin's hold or past
the loss rate (``silence.py`` judges which). What holds losses back is shown to operators
(``NodeWatch.holding``). The generations' health (hangs, starts, peer checks) is
``detection.py``'s; the two meet only in the coordinator's stall (``resumed``).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from unicron.brain.records import NodeRecord
from unicron.control.context import Context
from unicron.control.detect.silence import (
    BEHIND,
    BEHIND_SHARE,
    CAUGHT_UP_SHARE,
    QUIET_INTERVALS,
    QUIET_SHARE,
    BeatDelays,
    Lateness,
    SilenceJudge,
    Verdict,
)
from unicron.core.cadence import JITTER
from unicron.core.protocol import AGENT_REQUEST_TIMEOUT_S, AGENT_RETRY_CAP_S
from unicron.core.settings import Settings
from unicron.core.states import NodeState

LATENESS_KEPT_S = 600.0  # how far back the coordinator's lateness is looked up (a silence longer
# than that is judged with the lateness of the last ten minutes only)
HELD_NAMED = 20  # nodes named in one node_loss_held event (the count says how many)
# How often, per heartbeat interval, the nodes are looked over for silence (and the heartbeats'
# waits for the coordinator's lag): each look reads every node, which at thousands of nodes ten
# times a second was a tenth of the coordinator's loop; a loss is found this much later at most.
SWEEPS_PER_INTERVAL = 5


@dataclass(frozen=True)
class Silent:
    """A node to declare lost: silent ``silent_s`` since it was last heard, of which ``late_s``
    was the coordinator's own lateness (``silence.Lateness``: not counted against it), judged by
    a deadline of ``deadline_s`` (the cluster's, ``core/cadence.py``). The loss records all three,
    so that it says why the node, and not the coordinator, was at fault."""

    node: str
    silent_s: float
    late_s: float
    deadline_s: float


@dataclass(frozen=True)
class Holding:
    """What holds node losses back now (``silence.py``): what operators are shown."""

    by_hand: bool  # an admin holds every loss
    alarm: str | None  # a mass silence or the coordinator far behind, while its alarm holds
    domains: tuple[str, ...]  # failure domains partly silent, whose silent nodes are held
    nodes: int  # silent nodes held at the last look


def silent_nodes(
    nodes: Sequence[NodeRecord],
    now: float,
    listening_since: float,
    deadline_s: float,
    late_since: Callable[[float], float] = lambda then: 0.0,
) -> list[tuple[str, float]]:
    """Nodes not heard within ``deadline_s`` (the cluster's now: ``core/cadence.py``). A node
    not heard since the service could hear them at all (it started, took over, or resumed from
    a stall) is counted from then plus the agents' longest pause between retries: its agent,
    failing meanwhile, may be in that pause. So is a
    node heard only within an agent's request timeout of then: what was read may be a request
    its agent gave up on during a stall (read from the listen backlog after the resume; a
    healthy node was lost 2.6 s after a 20 s SIGSTOP that way), its agent still pausing.
    ``late_since(t)``: the longest the coordinator's own loop was late after ``t``
    (``silence.Lateness``): the node's heartbeats may have waited that long, not counted against it."""
    out = []
    fresh_from = listening_since + AGENT_REQUEST_TIMEOUT_S
    for node in nodes:
        heard = node.last_seen if node.last_seen >= fresh_from else listening_since + AGENT_RETRY_CAP_S
        heard = max(heard, node.last_seen)
        silent = now - heard  # (what the loss records: its last heartbeat is when the fault began)
        # (the lateness only lessens a silence: asked of a node past its deadline alone)
        past = silent > deadline_s and node.state is not NodeState.LOST
        if past and silent - late_since(heard) > deadline_s:
            out.append((node.name, silent))
    return out


def stalled_for(last_tick: float | None, now: float, limits: Settings) -> float | None:
    """How long the coordinator itself did not run (a SIGSTOP, a long pause of its process, an
    overloaded host, a request that blocked its loop), when that is longer than two heartbeat
    intervals (its loop ticks ten times a second); else None. Heartbeats could not be read
    meanwhile, so what went silent during it says nothing of the nodes."""
    if last_tick is None:
        return None
    gap = now - last_tick
    return gap if gap > 2 * limits.heartbeat_interval_s else None


@dataclass
class NodeWatch:
    """The nodes' silence as the coordinator judges it, and its own lateness."""

    ctx: Context
    listening_since: float | None = None  # since when the service could hear the nodes at all
    # Whose fault a silence is (``silence.py``): the coordinator's own lateness (the longest it
    # was late, over ``LATENESS_KEPT_S``), its heartbeats' waits, the mass-silence alarm and the
    # loss rate.
    lateness: Lateness = field(default_factory=lambda: Lateness(LATENESS_KEPT_S))
    delays: BeatDelays = field(init=False)
    silence: SilenceJudge = field(init=False)
    held: set[str] = field(default_factory=set)  # silent nodes not declared lost (said once each)
    _holding: Holding = field(default=Holding(False, None, (), 0), repr=False)  # as of the last look
    swept_at: float = -math.inf  # when the nodes were last looked over for silence
    lag: tuple[float, float] = (-math.inf, 0.0)  # (when, what) the heartbeats' waits last said
    # (the store's node changes it was read at, the nodes in service, their domains, each
    # domain's count): ``_in_service``
    _service: tuple[int, int, dict[str, str], Counter[str]] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.silence = SilenceJudge(self.ctx.limits)
        deadline = self.ctx.limits.heartbeat_deadline_s
        self.delays = BeatDelays(cap_s=deadline, window_s=deadline)

    def late(self, now: float, late_s: float) -> None:
        """A tick at ``now`` that the loop came to ``late_s`` later than planned: the coordinator
        is as late as that or as the heartbeats it reads waited, whichever is more."""
        if now - self.lag[0] >= self._sweep_every(now) or now < self.lag[0]:
            self.lag = (now, self.delays.lag(now))
        self.lateness.add(now, max(late_s, self.lag[1]))

    def late_s(self, now: float) -> float:
        """How late the coordinator has been over the last heartbeat deadline: what a node's
        silence is not counted against it for, were it last heard a deadline ago (operators
        watch it: ``unicron_coordinator_late_seconds``)."""
        return self.lateness.since(now - self.ctx.pace.judged(now).deadline_s)

    def _sweep_every(self, now: float) -> float:
        # (less a millisecond: ticks a tenth of a second apart on a float clock are not skipped)
        return self.ctx.pace.judged(now).interval_s / SWEEPS_PER_INTERVAL - 1e-3

    def heard(self, node: str, sent: float | None, waited_s: float | None, now: float) -> None:
        """A heartbeat its agent sent at ``sent``, ``waited_s`` after its last answered one (None:
        it did not say), was read ``now``."""
        if sent is not None:
            # (an agent's wait is its interval give or take its jitter: not the coordinator's lag)
            longest = self.ctx.pace.judged(now).interval_s * (1 + JITTER)
            unanswered = max(0.0, (waited_s or 0.0) - longest)
            self.delays.heard(node, now - sent, unanswered, now)

    def silent(self, now: float) -> list[Silent]:
        """The nodes to declare lost now, with how long each was silent: those past their
        deadline (``silent_nodes``), unless the silence is a mass silence, a failure domain's
        partial silence, or the loss rate is spent (``silence.SilenceJudge``); what is held,
        and the alarms, are recorded."""
        if self.listening_since is None:
            self.listening_since = now
        if now - self.swept_at < self._sweep_every(now) and now >= self.swept_at:
            return []
        self.swept_at = now
        in_service, domains, members = self._in_service()
        self.ctx.pace.nodes_in_service(in_service, now)
        deadline = self.ctx.pace.judged(now).deadline_s
        self.delays.cap_s = self.delays.window_s = deadline
        since, late = self.listening_since, self.lateness.since
        # A rising silence (``silence.py``): counted only while a node is past its deadline.
        quiet_s = max(QUIET_SHARE * deadline, QUIET_INTERVALS * self.ctx.pace.judged(now).interval_s)
        # (a node is silent no longer than since it was last heard: only those unheard for the
        # shorter of the two can be either)
        unheard = self.ctx.store.unheard_since(now - min(deadline, quiet_s))
        past = silent_nodes(unheard, now, since, deadline, late)
        quiet = len(silent_nodes(unheard, now, since, quiet_s, late)) if past and quiet_s < deadline else 0
        lag, alarm = self.lag[1], self.silence  # (the heartbeats' waits: ``late``)
        holding = alarm.alarm_since is not None and alarm.alarm_why == BEHIND
        behind = lag >= BEHIND_SHARE * deadline or (holding and lag >= CAUGHT_UP_SHARE * deadline)
        grace_s = AGENT_RETRY_CAP_S + deadline
        verdict = self.silence.judge(past, in_service, now, domains, grace_s, behind, quiet, members)
        self._domain_alarms(verdict)
        act = self.ctx.act
        if verdict.alarm_began:
            share, lag = round(len(past) / max(1, in_service), 3), round(self.lag[1], 3)
            said: dict[str, Any] = {"share": share, "why": verdict.alarm_why, "lag_s": lag}
            said["quiet"] = quiet  # unheard for QUIET_SHARE of a deadline, the silent among them
            act.record("mass_silence", silent=len(past), in_service=in_service, **said)
        if verdict.alarm_ended is not None:
            act.record("mass_silence_over", seconds=round(verdict.alarm_ended, 3), silent=len(past))
            if verdict.grace:  # the nodes still silent get a restart's grace (their agents may back off)
                self.listening_since = now
        alarm_held = verdict.alarm_why if verdict.alarm_holds else None  # (not once past its hold)
        whole = "held by hand" if self.silence.by_hand else alarm_held
        newly: dict[str, list[str]] = {}  # why -> nodes held from now
        for name in sorted(set(verdict.held) - self.held):
            in_held_domain = domains.get(name) in verdict.domains_held
            why = whole or ("domain silence" if in_held_domain else "node loss rate spent")
            newly.setdefault(why, []).append(name)
        for why, names in newly.items():  # one event for all held at once (a mass silence holds thousands)
            where = sorted({domains[n] for n in names if n in domains}) if why == "domain silence" else None
            act.record("node_loss_held", why=why, nodes=names[:HELD_NAMED], count=len(names), domains=where)
        self.held = set(verdict.held)
        self._holding = Holding(False, alarm_held, tuple(sorted(verdict.domains_held)), len(self.held))
        return [Silent(name, s, self.lateness.since(now - s), deadline) for name, s in verdict.lost]

    def _in_service(self) -> tuple[int, dict[str, str], Counter[str]]:
        """How many nodes are in service (not lost), the failure domain of each that named one,
        and how many each domain has: read from every node only after a node changed (added,
        removed, another state or domain)."""
        changes = self.ctx.store.node_changes
        if self._service is None or self._service[0] != changes:
            nodes = self.ctx.store.nodes()
            domains = {n.name: n.domain for n in nodes if n.domain and n.state is not NodeState.LOST}
            in_service = sum(n.state is not NodeState.LOST for n in nodes)
            self._service = (changes, in_service, domains, Counter(domains.values()))
        return self._service[1:]

    def _domain_alarms(self, verdict: Verdict) -> None:
        """A failure domain partly silent, and heard again: recorded (``silence.py``)."""
        for domain, silent, members in verdict.domains_began:
            self.ctx.act.record("domain_silence", domain=domain, silent=silent, in_service=members)
        for domain, seconds in verdict.domains_ended:
            self.ctx.act.record("domain_silence_over", domain=domain, seconds=round(seconds, 3))

    def resumed(self, now: float) -> None:
        """The coordinator ran again after a stall: every node gets a full heartbeat deadline
        from now (as after a restart), and the heartbeats' waits meanwhile are the stall's own."""
        self.listening_since = now
        self.delays.clear()  # (the stall's own grace covers it: not counted twice)

    def registered(self, node: str) -> None:
        """The node (re)registered: its next heartbeat sets its clock's floor anew."""
        self.delays.forget(node)

    def hold_losses(self, held: bool) -> None:
        """An admin holds every node loss, or releases the hold (``silence.py``)."""
        self.silence.by_hand = held

    def holding(self) -> Holding:
        """What held node losses back at the last look over the nodes (an admin's hold: now)."""
        return replace(self._holding, by_hand=self.silence.by_hand)

"""The severity ladder: which recovery tier a failure asks for, and when to escalate.

Pure (no I/O, clock passed in), so that the coordinator (``control/recover/recovery.py``) and the
simulator's Unicron policy (``sim/unicron_policy.py``) decide with the same code. The ladder
asks; what is carried out is the cheapest tier at or above it that applies (``core/tiers.py``),
and only that is counted (:meth:`Ladder.carried`), so the counts are of what happened.

The kind's severity gives the first tier (SEV3: reattempt in place, SEV2: restart the failed
processes, SEV1: reconfigure the cluster). A tier escalates one level when it was already carried
out too often for the task within the window (max_reattempts, max_restarts). A node that produced
``isolate_after`` SEV1 or SEV2 errors within the window is isolated (reconfigure). A task that
failed ``task_failure_limit`` times within the window is failed: restarting it again is futile.

A fault is counted against a node only when its scope is the worker or the node: a fault of the
task itself (its program; every rank failing alike) or of the checkpoint storage isolates no
node. Such a fault that repeats ``same_fault_limit`` times within the window fails the task with
the reason, instead of looping.

:meth:`Ladder.decide` reads the counts and changes nothing: the failure it counts comes with its
decision (``Decision.counted``), and the caller adds it (:meth:`Ladder.count`) when it carries
the decision out, as it adds the tier carried out (:meth:`Ladder.carried`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from unicron.core.kept import NodeErrors, TaskLadder
from unicron.core.settings import Settings
from unicron.core.taxonomy import TAXONOMY, ErrorKind, Scope, Severity
from unicron.core.tiers import Tier


@dataclass(frozen=True)
class Counted:
    """The failure a decision counts: against the task (its failures, each incident of the kind,
    the same task or storage fault when ``same``) and against ``node`` (None: no node)."""

    task: str
    kind: ErrorKind
    at: float
    node: str | None
    same: bool


@dataclass(frozen=True)
class Decision:
    kind: ErrorKind
    severity: Severity
    tier: Tier  # the tier asked for (FAIL_TASK when the task is to fail)
    isolate_node: bool
    why: str
    scope: Scope
    counted: Counted | None = None  # what it counts, once carried out (None: nothing more)

    @property
    def fail_task(self) -> bool:
        return self.tier is Tier.FAIL_TASK


@dataclass
class Ladder:
    settings: Settings
    actions: dict[str, list[tuple[float, Tier]]] = field(default_factory=dict)  # tiers carried out
    node_errors: dict[str, list[tuple[float, str, ErrorKind]]] = field(default_factory=dict)
    failures: dict[str, list[float]] = field(default_factory=dict)
    same: dict[tuple[str, ErrorKind], list[float]] = field(default_factory=dict)
    # (task, kind) -> when each incident of it was decided, whatever its scope: an incident found
    # later to be the task's own fault counts as the same fault once, by its time
    decided: dict[tuple[str, ErrorKind], list[float]] = field(default_factory=dict)

    # What changed since :meth:`changed` last said: the tasks and nodes whose records the
    # coordinator keeps again (a record each, so an incident rewrites only its own task's and
    # node's, not every task's counts: the decide bench's burst across 100 tasks).
    _touched: set[str] = field(default_factory=set, repr=False, compare=False)
    _touched_nodes: set[str] = field(default_factory=set, repr=False, compare=False)

    def changed(self) -> tuple[list[str], list[str]]:
        """The tasks and the nodes whose counts changed since the last call (sorted), to keep."""
        tasks, nodes = sorted(self._touched), sorted(self._touched_nodes)
        self._touched, self._touched_nodes = set(), set()
        return tasks, nodes

    def task_record(self, task: str) -> TaskLadder | None:
        """What the ladder counts of ``task``, to keep (None: nothing)."""
        same = [(k, times) for (t, k), times in self.same.items() if t == task]
        decided = [(k, times) for (t, k), times in self.decided.items() if t == task]
        actions, failures = self.actions.get(task, []), self.failures.get(task, [])
        if not (same or decided or actions or failures):
            return None
        return TaskLadder.model_construct(actions=actions, failures=failures, same=same, decided=decided)

    def node_record(self, node: str) -> NodeErrors | None:
        """The errors counted against ``node``, to keep (None: none)."""
        errors = self.node_errors.get(node)
        return NodeErrors.model_construct(errors=errors) if errors else None

    def restore(self, tasks: dict[str, TaskLadder], nodes: dict[str, NodeErrors]) -> None:
        """Count again what the kept records counted (each task's, each node's)."""
        self.actions = {t: list(r.actions) for t, r in tasks.items() if r.actions}
        self.failures = {t: list(r.failures) for t, r in tasks.items() if r.failures}
        self.same = {(t, k): list(times) for t, r in tasks.items() for k, times in r.same}
        self.decided = {(t, k): list(times) for t, r in tasks.items() for k, times in r.decided}
        self.node_errors = {n: list(r.errors) for n, r in nodes.items() if r.errors}

    def reattribute(self, task: str, kind: ErrorKind, now: float) -> None:
        """``task``'s fault of ``kind`` turned out to be its own (it struck several nodes alike):
        take back the node errors counted for it, and count the incidents decided for it within
        the window as the same task fault, each once (an incident decided as the task's own is
        counted already)."""
        for node, errors in list(self.node_errors.items()):
            kept = [e for e in errors if (e[1], e[2]) != (task, kind)]
            if len(kept) != len(errors):
                self._touched_nodes.add(node)
                if kept:
                    self.node_errors[node] = kept
                else:
                    del self.node_errors[node]  # (as a restore holds it: no record, no entry)
        self._touched.add(task)
        key = (task, kind)
        counted = set(self._recent(self.same.get(key, []), now))
        self.same[key] = sorted(counted | set(self._recent(self.decided.get(key, []), now)))

    def forget(self, task: str) -> None:
        """The task ended: its history no longer decides anything."""
        self._touched.add(task)
        self.actions.pop(task, None)
        self.failures.pop(task, None)
        for key in [k for k in self.same if k[0] == task]:
            del self.same[key]
        for key in [k for k in self.decided if k[0] == task]:
            del self.decided[key]

    def forget_node(self, node: str) -> None:
        """The node was removed: the errors counted against it no longer decide anything."""
        if self.node_errors.pop(node, None) is not None:
            self._touched_nodes.add(node)

    def _recent(self, times: list[float], now: float) -> list[float]:
        return [t for t in times if now - t <= self.settings.escalation_window_s]

    def decide(
        self, task: str, kind: ErrorKind, node: str | None, now: float, scope: Scope | None = None
    ) -> Decision:
        """The tier ``kind`` asks for on ``node`` now, counting this failure with those before
        (the counts are not changed: :meth:`count` adds ``Decision.counted``)."""
        info = TAXONOMY[kind]
        scope = scope or info.scope
        tier, why = info.tier, f"{info.severity.name} {kind.value}"
        if scope not in (Scope.WORKER, Scope.NODE):
            why += f" ({scope.value} fault: no node blamed)"
            node = None
        taken = [a for t, a in self.actions.get(task, []) if now - t <= self.settings.escalation_window_s]
        if tier is Tier.REATTEMPT and taken.count(Tier.REATTEMPT) >= self.settings.max_reattempts:
            tier, why = Tier.RESTART_FAILED, why + f"; reattempted {self.settings.max_reattempts}x"
        if tier is Tier.RESTART_FAILED and taken.count(Tier.RESTART_FAILED) >= self.settings.max_restarts:
            tier, why = Tier.RECONFIGURE, why + f"; restarted {self.settings.max_restarts}x"
        blamed = node if node is not None and info.severity in (Severity.SEV1, Severity.SEV2) else None
        isolate = False
        if blamed is not None:
            errors = len(self._recent_errors(blamed, now)) + 1
            isolate = (info.severity is Severity.SEV1 or errors >= self.settings.isolate_after) and (
                kind is not ErrorKind.NODE_LOST  # (a lost node is out already)
            )
            if isolate:
                tier = max(tier, Tier.RECONFIGURE)
                if info.severity is Severity.SEV2:
                    why += f"; node {blamed} had {errors} errors"
        failures = len(self._recent(self.failures.get(task, []), now)) + 1
        if failures >= self.settings.task_failure_limit:
            tier = Tier.FAIL_TASK
            why += f"; {failures} failures within {self.settings.escalation_window_s:g} s"
        same = scope in (Scope.TASK, Scope.STORAGE)
        if same:
            times = len({*self._recent(self.same.get((task, kind), []), now), now})
            if times >= self.settings.same_fault_limit:
                tier = Tier.FAIL_TASK
                why += f"; the same {scope.value} fault {times} times: restarting cannot mend it"
        counted = Counted(task, kind, now, blamed, same)
        return Decision(kind, info.severity, tier, isolate, why, scope, counted)

    def _recent_errors(self, node: str, now: float) -> list[tuple[float, str, ErrorKind]]:
        window = self.settings.escalation_window_s
        return [e for e in self.node_errors.get(node, []) if now - e[0] <= window]

    def count(self, counted: Counted | None) -> None:
        """Add the failure a decision counted (``Decision.counted``) to the counts: the task's
        failures and incidents of the kind, the same fault if it is the task's or the storage's,
        an error against the node blamed (a SEV1 or SEV2 kind)."""
        if counted is None:
            return
        task, kind, now = counted.task, counted.kind, counted.at
        self._touched.add(task)
        self.decided[(task, kind)] = [*self._recent(self.decided.get((task, kind), []), now), now]
        self.failures[task] = [*self._recent(self.failures.get(task, []), now), now]
        if counted.same:
            self.same[(task, kind)] = sorted({*self._recent(self.same.get((task, kind), []), now), now})
        if counted.node is not None:
            self.node_errors[counted.node] = [*self._recent_errors(counted.node, now), (now, task, kind)]
            self._touched_nodes.add(counted.node)

    def carried(self, task: str, tier: Tier, now: float) -> None:
        """``tier`` was carried out for ``task`` (asked for, or reached by escalation): what the
        escalation counts of later failures go by."""
        window = self.settings.escalation_window_s
        recent = [(t, a) for t, a in self.actions.get(task, []) if now - t <= window]
        self.actions[task] = [*recent, (now, tier)]
        self._touched.add(task)

"""Whose fault it is: every sign of a fault, and the scope it is attributed to.

A fault is attributed to its scope first (a worker, its node, the task itself or the checkpoint
storage), so that only worker and node faults count against a node (towards its isolation). The
same worker fault striking the task on two nodes at once is the task's own: its counts against
nodes are taken back (``Ladder.reattribute``), and the same kind stays the task's within the
escalation window. Each task's signs are kept (``core/kept.py:FaultSigns``, a record per task: a
sign rewrites only its own task's), so that a successor attributes the next sign as this
coordinator would.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from unicron.control.context import Context
from unicron.core.kept import FaultSigns
from unicron.core.ladder import Ladder
from unicron.core.taxonomy import TAXONOMY, ErrorKind, Scope


@dataclass(frozen=True)
class Sign:
    """One sign of a fault: when it was seen, what it was, where, and the generation the failing
    worker was in (None: not known, e.g. a node's silence)."""

    time: float
    kind: ErrorKind
    node: str | None
    generation: int | None = None


def attribute(sign: Sign, recent: Sequence[Sign], window: float) -> Scope:
    """The scope of a fault: its kind's, except that a worker fault that also struck the same
    task on another node within ``window``, in the same generation, is the task's own (a node
    fault does not crash processes on two machines at once). A worker that had gone on into a
    later generation (it survived the first fault and took part in the recovery) and failed
    there is a new failure, not the first one striking again."""
    scope = TAXONOMY[sign.kind].scope
    if scope is not Scope.WORKER or sign.node is None:
        return scope
    same = [
        r
        for r in recent
        if r.kind is sign.kind and sign.time - r.time <= window and r.node not in (None, sign.node)
    ]
    together = [r for r in same if None in (r.generation, sign.generation) or r.generation == sign.generation]
    return Scope.TASK if together else Scope.WORKER


@dataclass
class Attribution:
    ctx: Context
    ladder: Ladder
    recent: dict[str, list[Sign]] = field(default_factory=dict)  # every sign of a fault, per task
    task_faults: dict[tuple[str, ErrorKind], list[float]] = field(default_factory=dict)

    def note(self, name: str, sign: Sign, scope: Scope | None = None) -> Scope:
        """Note every sign of a fault, also those that join an open incident: the same fault on
        a second node makes it the task's own, and its earlier counts against nodes are taken
        back. Once the task's own, the same kind stays so within the escalation window."""
        window, now, kind = self.ctx.limits.escalation_window_s, sign.time, sign.kind
        recent = [r for r in self.recent.get(name, []) if now - r.time <= window]
        self.recent[name] = [*recent, sign]
        sticky = [t for t in self.task_faults.get((name, kind), []) if now - t <= window]
        if scope is None:  # (a scope the caller gives, such as a fresh launch's, says nothing of others)
            scope = attribute(sign, recent, self.ctx.limits.task_fault_window_s)
            if scope is Scope.TASK and not sticky:
                # The same fault on another node: the earlier incidents of its kind were the task's.
                self.ladder.reattribute(name, kind, now)
                self.ctx.act.keep_ladder(self.ladder)
        if scope is Scope.TASK or sticky:
            self.task_faults[(name, kind)] = [*sticky, now]
            scope = Scope.TASK
        self.ctx.act.keep_of(FaultSigns, self.kept(name), name)
        return scope

    def kept(self, name: str) -> FaultSigns | None:
        """The task's recent signs and the kinds found to be its own, to keep (None: none)."""
        recent = [(s.time, s.kind, s.node, s.generation) for s in self.recent.get(name, [])]
        faults = [(k, times) for (n, k), times in self.task_faults.items() if n == name]
        return FaultSigns(recent=recent, task_faults=faults) if recent or faults else None

    def restore(self, kept: dict[str, FaultSigns]) -> None:
        """Attribute again as the kept records (each task's) say."""
        self.recent = {n: [Sign(*s) for s in signs.recent] for n, signs in kept.items() if signs.recent}
        self.task_faults = {
            (n, k): list(times) for n, signs in kept.items() for k, times in signs.task_faults
        }

    def forget(self, name: str) -> None:
        """The task ended: its signs no longer attribute anything."""
        self.recent.pop(name, None)
        self.task_faults = {k: v for k, v in self.task_faults.items() if k[0] != name}
        self.ctx.act.keep_of(FaultSigns, None, name)

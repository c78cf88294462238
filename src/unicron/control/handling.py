"""The severity ladder: which action handles an incident, and when to escalate.

The kind's severity gives the first action (SEV3: reattempt in place, SEV2: restart the process,
SEV1: reconfigure the cluster). An action escalates one level when it was already taken too often
for the task within the window (max_reattempts, max_restarts). A node that produced
``isolate_after`` SEV1 or SEV2 errors within the window is isolated (reconfigure). A task that
failed ``task_failure_limit`` times within the window is failed: restarting it again is futile.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from unicron.core.settings import Settings
from unicron.core.taxonomy import TAXONOMY, Action, ErrorKind, Severity


@dataclass(frozen=True)
class Decision:
    kind: ErrorKind
    severity: Severity
    action: Action
    isolate_node: bool
    fail_task: bool
    why: str


@dataclass
class Ladder:
    settings: Settings
    actions: dict[str, list[tuple[float, Action]]] = field(default_factory=dict)
    node_errors: dict[str, list[float]] = field(default_factory=dict)
    failures: dict[str, list[float]] = field(default_factory=dict)

    def _recent(self, times: list[float], now: float) -> list[float]:
        return [t for t in times if now - t <= self.settings.escalation_window_s]

    def decide(self, task: str, kind: ErrorKind, node: str | None, now: float) -> Decision:
        info = TAXONOMY[kind]
        action, why = info.action, f"{info.severity.name} {kind.value}"
        taken = [
            (t, a) for t, a in self.actions.get(task, []) if now - t <= self.settings.escalation_window_s
        ]
        if (
            action is Action.REATTEMPT
            and sum(a is Action.REATTEMPT for _, a in taken) >= self.settings.max_reattempts
        ):
            action, why = Action.RESTART_PROCESS, why + f"; reattempted {self.settings.max_reattempts}x"
        if (
            action is Action.RESTART_PROCESS
            and sum(a is Action.RESTART_PROCESS for _, a in taken) >= self.settings.max_restarts
        ):
            action, why = Action.RECONFIGURE, why + f"; restarted {self.settings.max_restarts}x"
        isolate = False
        if node is not None and info.severity in (Severity.SEV1, Severity.SEV2):
            errors = [*self._recent(self.node_errors.get(node, []), now), now]
            self.node_errors[node] = errors
            if info.severity is Severity.SEV1 or len(errors) >= self.settings.isolate_after:
                isolate = kind is not ErrorKind.NODE_LOST  # a lost node is out already
                if isolate and info.severity is Severity.SEV2:
                    why += f"; node {node} had {len(errors)} errors"
                if isolate:
                    action = Action.RECONFIGURE
        failures = [*self._recent(self.failures.get(task, []), now), now]
        self.failures[task] = failures
        fail = len(failures) >= self.settings.task_failure_limit
        if fail:
            why += f"; {len(failures)} failures within {self.settings.escalation_window_s:g} s"
        self.actions[task] = [*taken, (now, action)]
        return Decision(kind, info.severity, action, isolate, fail, why)

"""What each incident cost, phase by phase: a pure reading of the event log.

An incident's events, from the coordinator's log (``recovery.py`` and ``coordinator.py`` record
them as they happen):

- ``incident``: when the fault began (``fault_at``: the injection's time when it was injected,
  else when its first sign was seen on a worker or agent, or a lost node's last heartbeat:
  ``fault_source``), when the coordinator
  detected it (``detected_at``), its kind and severity, and the ladder's first action; for a
  worker that ended before its first step, its output file (``log``) and last lines (``log_tail``);
- ``response``: when the response was decided and carried out (``decided_at``);
- ``root_cause``: a surer verdict found later (the lost node behind the peers' connection
  errors that opened it): its kind and node replace the first ones;
- ``escalation``: a tier that failed, or could not apply, and the one taken instead (``carried``:
  whether that one was carried out, or only passed on the way);
- ``recomputed``: micro-batches that survivors computed for ranks that left mid-step (partial
  reuse keeps the survivors' own; the departed ranks' share is recomputed: the lost work);
- ``outcome``: how it ended; when recovered, the first step completed after it: its end
  (``regained_at``: training regained), when its computing resumed (``resumed_at``: the end of
  the transition: the step's start after a relaunch, or the moment the survivors' group
  re-formed within it), and the step it was (steps redone after a restart from a checkpoint are
  lost work too).

``breakdowns(events)`` gives every incident found there, open ones included, oldest first.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from unicron.brain.records import EventRecord

PHASES = ("detection", "decision", "transition", "first_step")
KINDS = ("incident", "response", "root_cause", "escalation", "recomputed", "outcome")  # what it reads


@dataclass(frozen=True)
class Breakdown:
    incident: int
    task: str | None
    node: str | None
    kind: str
    severity: str
    detected_at: float
    fault_at: float | None = None
    fault_source: str | None = None  # "injected" | "first report" | "last heartbeat" (a lost node)
    decided_at: float | None = None
    transition_done_at: float | None = None  # computing resumed (the first step after, or in it)
    regained_at: float | None = None  # that step ended: training regained
    outcome: str | None = None  # None while open; "recovered", "superseded", "task failed", ...
    downtime_s: float | None = None  # the task's: from the failure stopping it to that first step
    actions: tuple[str, ...] = ()
    lost_steps: int | None = None  # completed steps redone (a restart from a checkpoint)
    lost_micro_batches: int = 0  # micro-batches recomputed for ranks that left mid-step
    step: int = 0  # the last step completed when it was detected
    first_seen_as: str | None = None  # the kind it was opened as, when a root cause was found later
    why: str = ""
    # A worker that ended before its first step: its output file on ``node`` and its last lines.
    log: str | None = None
    log_tail: str | None = None
    detail: dict[str, Any] = field(default_factory=dict, compare=False)

    def seconds(self) -> dict[str, float | None]:
        """Each phase's length: fault to detection, detection to decision, decision to the
        transition's end (computing resumed), and from there to the first step's end."""
        marks = [self.fault_at, self.detected_at, self.decided_at, self.transition_done_at, self.regained_at]
        return {
            phase: None if a is None or b is None else round(max(0.0, b - a), 4)
            for phase, a, b in zip(PHASES, marks, marks[1:], strict=False)
        }

    def as_dict(self) -> dict[str, Any]:
        shown = {k: v for k, v in self.__dict__.items() if k != "detail"}
        return {**shown, "actions": list(self.actions), "seconds": self.seconds(), "summary": line(self)}


def _opened(e: EventRecord) -> Breakdown:
    d = e.detail
    detected = float(d.get("detected_at", e.time))
    fault_at = d.get("fault_at")
    if fault_at is None and d.get("detection_s") is not None:  # recorded before fault_at was
        fault_at = detected - float(d["detection_s"])
    return Breakdown(
        incident=e.id,
        task=e.task,
        node=e.node,
        kind=str(d.get("kind", "")),
        severity=str(d.get("severity", "")),
        detected_at=detected,
        fault_at=None if fault_at is None else float(fault_at),
        fault_source=d.get("fault_source"),
        actions=(str(d["action"]),) if d.get("action") else (),
        step=int(d.get("step", 0)),
        why=str(d.get("why", "")),
        log=d.get("log"),
        log_tail=d.get("log_tail"),
        detail=d,
    )


def _closed(b: Breakdown, e: EventRecord) -> Breakdown:
    d = e.detail
    outcome = replace(b, outcome=str(d.get("outcome")), actions=tuple(d.get("actions") or b.actions))
    if d.get("outcome") != "recovered":
        return outcome
    ended, computing = d.get("first_step_ended_at"), d.get("resumed_at")
    resumed = d.get("resumed_step")
    return replace(
        outcome,
        regained_at=None if ended is None else float(ended),
        transition_done_at=None if computing is None else float(computing),
        downtime_s=d.get("downtime_s"),
        lost_steps=None if resumed is None else max(0, b.step - (int(resumed) - 1)),
    )


def breakdowns(events: Iterable[EventRecord]) -> list[Breakdown]:
    """Every incident in ``events`` (in id order), with what the later events tell of it."""
    found: dict[int, Breakdown] = {}
    for e in events:
        ref = e.detail.get("incident")
        if e.kind == "incident":
            found[e.id] = _opened(e)
        elif ref not in found:
            continue
        elif e.kind == "response":
            found[ref] = replace(found[ref], decided_at=float(e.detail.get("decided_at", e.time)))
        elif e.kind == "root_cause":
            b = found[ref]
            found[ref] = replace(b, kind=str(e.detail.get("kind")), node=e.node, first_seen_as=b.kind)
        elif e.kind == "escalation" and e.detail.get("carried", True):
            found[ref] = replace(found[ref], actions=(*found[ref].actions, str(e.detail.get("to_action"))))
        elif e.kind == "recomputed":
            lost = found[ref].lost_micro_batches + int(e.detail.get("micro_batches", 0))
            found[ref] = replace(found[ref], lost_micro_batches=lost)
        elif e.kind == "outcome":
            found[ref] = _closed(found[ref], e)
    return list(found.values())


def line(b: Breakdown) -> str:
    """One incident's breakdown as ``unicron events`` prints it."""
    s = b.seconds()
    phases = ", ".join(f"{p.replace('_', ' ')} {s[p]:.3f} s" for p in PHASES if s[p] is not None)
    steps = "?" if b.lost_steps is None else b.lost_steps
    lost = f"lost {steps} step(s), {b.lost_micro_batches} micro-batch(es)"
    source = f" (fault {b.fault_source})" if b.fault_source else ""
    return f"{phases or 'not yet timed'}{source}; {lost}; actions: {' -> '.join(b.actions) or 'none'}"

"""Draining a node, as an admin takes a machine out for maintenance (Slurm's ``state=drain``):
nothing new is placed there, and the tasks on it move off without losing a step; it stays out
until resumed (``state=resume``).

The node leaves the planner's view at once (only healthy nodes are planned), so the next plan
places its tasks elsewhere. A task that recovers in process moves by planned membership changes
at step boundaries: newcomers join its live replicas on the slots the plan gives it (taking
their state from them), then the members on the drained node leave (``moves.move_for``). A
task that cannot (restart recovery, or no slot to grow into) is relaunched from its newest
checkpoint where the plan puts it. A drained node's heartbeats go on; it is drained, not lost.
"""

from __future__ import annotations

from unicron.brain.records import NodeRecord
from unicron.core.errors import Conflict, NotFound
from unicron.core.states import NodeState


def drainable(name: str, node: NodeRecord | None) -> None:
    """Nothing, or the error that says why ``name`` cannot be drained."""
    if node is None:
        raise NotFound(f"no node named {name!r}")
    if node.state is NodeState.LOST:
        raise Conflict(f"node {name!r} is lost: nothing runs there to move; remove it, or drain it once back")
    if node.state is NodeState.DRAINING:
        raise Conflict(f"node {name!r} is already draining; resume it to put it back in service")


def resumable(name: str, node: NodeRecord | None) -> None:
    """Nothing, or the error that says why ``name`` cannot be resumed."""
    if node is None:
        raise NotFound(f"no node named {name!r}")
    if node.state not in (NodeState.DRAINING, NodeState.ISOLATED):
        raise Conflict(
            f"node {name!r} is {node.state.value}, not draining or isolated: there is nothing to resume"
        )


def returning_state(known: NodeRecord | None, isolated_until: float | None, now: float) -> NodeState:
    """The state a node registering (again) takes.

    An admin's drain and the ladder's isolation outlast the agent: a node isolated or drained
    stays so when its agent re-registers, and also when it was lost meanwhile (a drained node
    rebooted for its maintenance comes back drained, as Slurm keeps ``state=drain`` across a
    reboot: the node's row keeps the drain, ``records.drained_across``), until resumed or until its
    isolation runs out (``isolated_until`` None: it runs until resumed)."""
    if known is None:
        return NodeState.HEALTHY
    if known.state in (NodeState.ISOLATED, NodeState.DRAINING):
        return known.state
    if known.state is NodeState.LOST and known.drained:
        return NodeState.DRAINING
    if known.state is NodeState.LOST and (isolated_until is None or now < isolated_until):
        return NodeState.ISOLATED
    return NodeState.HEALTHY

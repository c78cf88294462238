"""Whether a node's record may go: removed by an admin (``DELETE /v1/nodes/{name}``), or
forgotten once lost for ``forget_lost_node_s``.

A lost node stays listed for a while so that its return is known (its tasks' copies, a drain
that outlives it). A registration nobody will bring back (a retired machine, a name registered
by mistake) blocks the cluster when its slot count differs from the real agents'; an admin
removes it, and one left alone is forgotten (a dead node would otherwise cost every tick and
every plan forever). Only a lost node holding no workers can go: a live agent registers again at
its next heartbeat, as a new node.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from unicron.brain.records import NodeRecord
from unicron.core.errors import Conflict, NotFound
from unicron.core.states import NodeState


def removable(name: str, node: NodeRecord | None, held: dict[str, int]) -> None:
    """Nothing, or the error that says why ``name`` cannot be removed and what to do."""
    if node is None:
        raise NotFound(f"no node named {name!r}")
    if node.state is not NodeState.LOST:
        raise Conflict(
            f"node {name!r} is {node.state.value}: stop its agent first; it is removable once "
            "declared lost (after the heartbeat deadline)"
        )
    if held:
        raise Conflict(f"node {name!r} still holds workers of {sorted(held)}: wait until they are stopped")


def forgettable(
    nodes: Iterable[NodeRecord],
    held: Callable[[], Mapping[str, Mapping[str, int]]],
    now: float,
    after_s: float,
) -> list[str]:
    """The lost nodes not heard for ``after_s`` that hold no workers: their records can go.
    ``held`` (node -> task -> workers) is asked only when some node is that old (it reads every
    worker, and this runs on every tick)."""
    old = [n.name for n in nodes if n.state is NodeState.LOST and now - n.last_seen >= after_s]
    holding = held() if old else {}
    return [name for name in old if not holding.get(name)]

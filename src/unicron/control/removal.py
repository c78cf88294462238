"""Whether an admin may remove a node's record (``DELETE /v1/nodes/{name}``).

Nodes are never forgotten on their own: a lost node stays listed so that its return is known.
A registration nobody will bring back (a retired machine, a name registered by mistake) blocks
the cluster when its slot count differs from the real agents'; an admin removes it. Only a lost
node holding no workers can go: a live agent would register again at its next heartbeat.
"""

from __future__ import annotations

from unicron.control.records import NodeRecord
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

"""Whether new processes fit on their nodes now.

A slot (a device) is free only once the process that held it has exited: a worker of a
generation being stopped, a member leaving in a shrink, a spare being stopped all keep their
GPU memory until then. The plan may give their slots to another task at once, but that task's
processes start only when they fit beside the ones still there; until then the launch waits and
the same plan is carried out again, not decided anew (``Placer.carry_out_held``). Started beside
them, a newcomer would be handed a device index past the node's slots, that is (modulo the
node's devices) a GPU another process still uses.
"""

from __future__ import annotations

from collections.abc import Mapping


def fits(new: Mapping[str, int], in_use: Mapping[str, int], slots: Mapping[str, int]) -> bool:
    """Whether ``new`` (node -> processes) fits beside the processes holding a slot on each node
    now (``in_use``), within the node's ``slots``."""
    return all(in_use.get(n, 0) + c <= slots.get(n, 0) for n, c in new.items() if c > 0)

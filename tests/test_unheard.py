"""The nodes unheard since a time (``control/store/unheard.py``), found without reading every node:
over random sequences of heartbeats, registrations, removals and looks, always the nodes a
pass over all of them finds, by id; and the heap stays bounded however long nobody looks."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from unicron.brain.records import NodeRecord
from unicron.control.store.unheard import ENTRIES_PER_NODE, Unheard
from unicron.core.states import NodeState

NAMES = [f"n{i}" for i in range(6)]

# (what, node index, time step): a heartbeat, a registration (new, or again), a removal, a look
Step = tuple[str, int, int]
steps = st.lists(
    st.tuples(st.sampled_from(["beat", "register", "remove", "look"]), st.integers(0, 5), st.integers(0, 3)),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(steps, st.integers(1, 6))
def test_the_nodes_unheard_since_a_time_are_those_a_pass_over_every_node_finds(
    sequence: list[Step], window: int
) -> None:
    nodes: dict[str, NodeRecord] = {}
    unheard = Unheard(nodes)
    now, next_id = 0.0, 1
    for what, index, advance in sequence:
        now += advance
        name = NAMES[index]
        if what == "register":
            known = nodes.get(name)
            if known is None:
                nodes[name] = NodeRecord(next_id, name, 1, [], "h", NodeState.HEALTHY, now)
                next_id += 1
            else:
                nodes[name] = replace(known, last_seen=now)
            unheard.heard(name, now, nodes)
        elif what == "beat" and name in nodes:
            nodes[name] = replace(nodes[name], last_seen=now)
            unheard.heard(name, now, nodes)
        elif what == "remove" and name in nodes:
            del nodes[name]
            unheard.forget(name)
        elif what == "look":  # (a look further back than the last: the deadline grew)
            cutoff = now - window - index
            expected = sorted((n for n in nodes.values() if n.last_seen < cutoff), key=lambda n: n.id)
            assert unheard.since(cutoff, nodes) == expected


def test_the_heap_is_made_again_when_nobody_looks() -> None:
    nodes = {name: NodeRecord(i, name, 1, [], "h", NodeState.HEALTHY, 0.0) for i, name in enumerate(NAMES)}
    unheard = Unheard(nodes)
    for beat in range(1, 2000):
        for name in NAMES:
            nodes[name] = replace(nodes[name], last_seen=float(beat))
            unheard.heard(name, float(beat), nodes)
    assert len(unheard._heap) <= ENTRIES_PER_NODE * len(NAMES) + 1024 + 1
    assert unheard.since(1999.0, nodes) == [] and len(unheard.since(2000.0, nodes)) == len(NAMES)

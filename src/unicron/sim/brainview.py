"""The simulated cluster as the brain sees it: a failure's snapshot, for the coordinator's own
failure decision (``brain/deciding.py:decide``) to answer.

The simulator counts GPUs per task per node (``Simulation.assignment``); the brain reads workers
by rank, nodes by state. One worker per GPU, ranks in node order (as a launch numbers them);
nodes out of service are isolated (the simulator does not tell an isolated node from one in
repair, and both count against the isolation budget), the struck node, when the engine took it
out for repair, is lost. The failed ranks are the task's ranks on the struck node (the GPUs the
engine counts as hit), none for a fault that kills no process (SEV3).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from unicron.brain.records import NodeRecord, TaskRecord, WorkerRecord
from unicron.brain.response import Failure
from unicron.brain.snapshot import Snapshot
from unicron.core.states import NodeState, TaskState, WorkerPhase
from unicron.core.taxonomy import TAXONOMY, ErrorKind, Severity

GENERATION = 1  # the simulator keeps no generations: every decision is of the one running


def running_task(name: str, workers: int) -> TaskRecord:
    """A task that trains on ``workers``: the fields a failure's decision reads."""
    return TaskRecord(
        name=name,
        spec="",
        state=TaskState.RUNNING,
        generation=GENERATION,
        workers=workers,
        step=0,
        checkpoint_step=0,
        store_port=0,
        failures=0,
        restarts=0,
        down_since=None,
        downtime_s=0.0,
        samples=0,
        flop=0.0,
        digest=None,
        submitted=0.0,
        started=0.0,
        finished=None,
        reason=None,
        launched_generation=GENERATION,
        redo_until=0,
    )


def members_of(task: str, first: int, node: str, count: int) -> list[WorkerRecord]:
    """``count`` running workers of ``task`` on ``node``, ranks from ``first``: records equal to
    ``WorkerRecord(...)``'s, made from one made so (``WorkerRecord.as_rank``): a view of a 16,384-GPU
    task holds 16,384 of them at each failure, and their set-up was most of such a scenario's
    time. ``tests/test_same_brain.py`` checks that they are equal."""
    if count <= 0:
        return []
    like = WorkerRecord(task, GENERATION, first, node, 0, WorkerPhase.RUNNING, None, None, None, 0.0)
    return [like] + [like.as_rank(first + local, local) for local in range(1, count)]


BLOCKS_KEPT = 1 << 16  # member blocks kept for reuse (a 2,048-node task's are 2,048)


@dataclass
class Views:
    """The records the brain reads, made once and reused: each simulated node's in a state (out
    of service isolated, the struck node taken out for repair lost, the others healthy), and
    each node's block of a task's members by its first rank and count (the same records while
    neither changes: a failure moves the ranks after the node that left, not those before it).
    Made anew at each failure, a 2,048-node task's were most of a 16,384-GPU scenario's time."""

    slots: int
    nodes_made: dict[tuple[int, NodeState], NodeRecord] = field(default_factory=dict)
    blocks: dict[tuple[str, int, int, int], list[WorkerRecord]] = field(default_factory=dict)

    def node(self, node: int, state: NodeState) -> NodeRecord:
        key = (node, state)
        if key not in self.nodes_made:
            self.nodes_made[key] = NodeRecord(node, str(node), self.slots, [], "", state, 0.0)
        return self.nodes_made[key]

    def nodes(self, nodes: int, healthy: set[int], struck: int, out: bool) -> dict[str, NodeRecord]:
        views = {}
        for n in range(nodes):
            state = NodeState.HEALTHY if n in healthy else NodeState.ISOLATED
            views[str(n)] = self.node(n, NodeState.LOST if out and n == struck else state)
        return views

    def block(self, task: str, node: int, first: int, count: int) -> list[WorkerRecord]:
        key = (task, node, first, count)
        made = self.blocks.get(key)
        if made is None:
            if len(self.blocks) >= BLOCKS_KEPT:
                self.blocks.clear()
            made = self.blocks[key] = members_of(task, first, str(node), count)
        return made

    def failure(
        self,
        task: str,
        kind: ErrorKind,
        struck: int,
        lost: int,
        out: bool,
        assignment: Mapping[int, Mapping[str, int]],
        nodes: Mapping[str, NodeRecord],
        running: int,
    ) -> tuple[Snapshot, Failure]:
        """The snapshot of ``task`` when ``kind`` struck node ``struck``, where it had ``lost``
        GPUs (``out``: the engine took the node out, its GPUs off the placement), and the
        failure. ``running``: the task's members (the placement holds the slots of newcomers
        that have not joined yet too: the members are the first ``running`` in rank order, the
        newcomers the last, as a grow ranks them; where the simulator placed them is not known)."""
        placed = {n: tasks.get(task, 0) for n, tasks in assignment.items()}
        if out:
            placed[struck] = lost
        members: list[WorkerRecord] = []
        failed = range(0)
        for node in sorted(n for n, count in placed.items() if count):
            first = len(members)
            members += self.block(task, node, first, min(placed[node], running - first))
            if node == struck:
                failed = range(first, len(members))
            if len(members) >= running:
                break
        snapshot = Snapshot(
            tasks={task: running_task(task, len(members))},
            nodes=nodes,
            members={task: tuple(members)},
            next_generation={task: GENERATION + 1},
        )
        gone = frozenset() if TAXONOMY[kind].severity is Severity.SEV3 else frozenset(failed)
        return snapshot, Failure(task, str(struck), kind.value, gone)

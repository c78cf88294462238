"""Acting: the one place that changes the world outside the coordinator's own memory.

Deciders (``brain/response.py:respond``, ``brain/membership.py:survivors``, ``core/ladder.py``,
``detection.py``, ``spares.py``, the planner) are pure: they return frozen decisions, many of them
as a list of effects (``brain/effects.py``). The :class:`Applier` carries them out: it writes the
store, posts to the tasks' rendezvous stores and queues orders for the agents. No other part of
the coordinator does any of the three: the others hold the store only through its read-only face
(``store/reads.py:StoreReads``), so a write anywhere else does not type-check. Facts reported
from outside (a heartbeat, a counted step, a checkpoint) are recorded through the applier's named
operations, which are the store's own.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from unicron.brain.effects import (
    Effect,
    EndWorkers,
    HostStore,
    Isolate,
    Launch,
    Launched,
    Record,
    Resized,
    StopGeneration,
    Stopping,
    StopWorker,
    Switch,
    TaskDown,
    TellStore,
    UseSpare,
)
from unicron.brain.records import TaskRecord, WorkerRecord
from unicron.control.act.happened import Happened
from unicron.control.act.posting import Posts
from unicron.control.act.rendezvous import POSTED_PER_TASK, Rendezvous
from unicron.control.store.store import Store
from unicron.core.events import TaskDone
from unicron.core.kept import Kept, NodeErrors, Posted, TaskLadder, kept_name
from unicron.core.ladder import Ladder
from unicron.core.protocol import (
    SPARE_GENERATION,
    Current,
    DumpStacks,
    ForgetTask,
    LaunchWorker,
    Order,
    Registration,
    RenameWorkers,
    StopWorkers,
    StoreMoved,
    current_key,
    membership_key,
    spare_key,
)
from unicron.core.states import NodeState, TaskState, WorkerPhase
from unicron.core.workerenv import KEYS

# What the coordinator posted in each live task's store for its workers to read (``Posted``,
# store key -> value, oldest first): the memberships that followed each old generation and the
# identities given to hot spares. Kept so that a coordinator starting over posts them again: its
# new store would lack them, and a member that had not yet read its way to the current generation
# would neither follow it nor be let commit (``train/fencing.py``), and a spare told to join would
# wait for its identity until the group gave it up. (As many as ``Rendezvous`` puts back.)


@dataclass
class Orders:
    """Orders for each node's agent, numbered, and kept until the agent acknowledges them: an
    answer lost on its way (the agent's request timed out meanwhile) is sent again. Every order
    is idempotent at the agent, so a repeat is harmless. Numbers start at the coordinator's
    start time in microseconds, so they keep growing across coordinator restarts."""

    next_seq: int = 0
    queues: dict[str, list[tuple[int, Order]]] = field(default_factory=dict)
    on_add: Callable[[str], None] | None = None  # wakes the node's waiting long poll
    # The stops in each node's queue, so that a repeated one is found at once: compared with
    # every queued order, a heartbeat listing 1,024 stray workers (each ordered to stop) took
    # 4 s of the coordinator's loop (issue 53).
    stops: dict[str, set[StopWorkers]] = field(default_factory=dict)

    def add(self, node: str, order: Order) -> None:
        queue = self.queues.setdefault(node, [])
        if isinstance(order, StopWorkers):
            stops = self.stops.setdefault(node, set())
            if order in stops:
                return
            stops.add(order)
        self.next_seq += 1
        queue.append((self.next_seq, order))
        if self.on_add is not None:
            self.on_add(node)

    def pending(self, node: str, acked: int) -> list[tuple[int, Order]]:
        """The node's orders after ``acked`` (those up to it are dropped: carried out)."""
        queue = self.queues.get(node)
        if not queue:
            return []
        kept = [(seq, o) for seq, o in queue if seq > acked]
        if len(kept) < len(queue):
            self.stops[node] = {o for _, o in kept if isinstance(o, StopWorkers)}
        self.queues[node] = kept
        return list(kept)

    def take(self, node: str) -> list[Order]:
        """Drop the node's orders unsent (it is lost: they mean nothing any more)."""
        self.stops.pop(node, None)
        return [o for _, o in self.queues.pop(node, [])]


@dataclass
class PutBack:
    """Values put back in a task's store since its last ``store_values_restored`` event."""

    said_at: float
    count: int = 0
    keys: list[str] = field(default_factory=list)


PUT_BACK_EVERY_S = 1.0  # how often the tasks' stores are checked for what was deleted or replaced
PUT_BACK_SAID_EVERY_S = 60.0  # ... and how often, at most, an attack that goes on is recorded again


class Applier:
    def __init__(self, store: Store, rendezvous: Rendezvous, orders: Orders) -> None:
        self._store = store
        self.rendezvous = rendezvous
        self.posts = Posts(rendezvous, store.journal)  # written once durable, off the loop
        self.orders = orders
        self.happened = Happened()  # the cluster events carried out, for the planner
        # Tasks ended that the coordinator has not taken yet (``next_ended``): it frees what it
        # and its parts hold of each, whichever part's effects ended it.
        self._ended: list[str] = []
        # Called with each event recorded: (id, kind, task, detail).
        self.listeners: list[Callable[[int, str, str | None, dict[str, Any]], None]] = []
        # Facts reported from outside, recorded as they come (the store's own operations).
        self.add_task = store.add_task
        self.replace_task = store.replace_task  # a name whose task ended, submitted again
        self.task_stopping = store.task_stopping
        self.task_waiting = store.task_waiting
        self.task_running = store.task_running
        self.task_membership = store.task_membership
        self.task_store_port = store.task_store_port
        self.task_checkpointed = store.task_checkpointed
        self.task_done = store.task_done
        self.count_iteration = store.count_iteration
        self.node_seen = store.node_seen
        self.worker_phase = store.worker_phase
        self.end_workers = store.end_workers
        self.keep = store.keep_record  # what a part keeps across a restart (the ladder, measured rates)
        self.drop_kept = store.drop_record  # a kept record of a task or node no longer needed
        self.close_store = store.close
        self._put_back_due = 0.0
        self._put_back: dict[str, PutBack] = {}  # task -> values put back not yet recorded

    def keep_of(self, kind: type[Kept], record: Kept | None, of: str) -> None:
        """Keep ``record`` as the one of ``kind`` of the task or node ``of``; None: keep none."""
        if record is not None:
            self._store.keep_record(record, of=of)
        elif self._store.kept(kept_name(kind, of)) is not None:
            self._store.drop_record(kind, of=of)

    def keep_ladder(self, ladder: Ladder) -> None:
        """Keep what the ladder counted since it was last kept: the record of each task and node
        whose counts changed (an incident's own; a task ended: its record dropped)."""
        tasks, nodes = ladder.changed()
        for task in tasks:
            self.keep_of(TaskLadder, ladder.task_record(task), task)
        for node in nodes:
            self.keep_of(NodeErrors, ladder.node_record(node), node)

    def record(self, what: str, task: str | None = None, node: str | None = None, **detail: Any) -> int:
        """Record an event; then tell the listeners (the metrics). Returns the event's id."""
        event_id = self._store.event(what, task, node, **detail)
        for listen in self.listeners:
            listen(event_id, what, task, detail)
        return event_id

    def apply(self, effects: Iterable[Effect], now: float) -> None:
        """Carry out a decider's effects, in order."""
        for effect in effects:
            match effect:
                case Record(kind, task, node, detail):
                    self.record(kind, task=task, node=node, **detail)
                case TaskDown(task, to, reason, began):
                    self._store.task_down(task, to, now, reason=reason, began=began)
                    if not to.live:
                        self._noted_end(task)
                case StopWorker(worker, grace_s):
                    self.stop_worker(worker, grace_s)
                case StopGeneration(task, generation, grace_s):
                    self.stop_generation(task, generation, grace_s)
                case Isolate(node, why, until, grace_s):
                    self.node_state(node, NodeState.ISOLATED)
                    self.record("node_isolated", node=node, why=why, until=until)
                    self.stop_node(node, grace_s)
                case Switch():
                    self.switch(effect, now)
                case Launch():
                    self.launch(effect, now)
                case UseSpare(task, spare, node, local, generation, rank, world):
                    self.use_spare(task, spare, node, local, generation, rank, world, now)
                case Resized(task, generation, workers):
                    self.task_membership(task, generation, workers)
                case EndWorkers(task, generation, to):
                    self.end_workers(task, generation, to)
                case Stopping(task):
                    self.task_stopping(task, now)
                case HostStore(task, port):
                    if (served := self.rendezvous.host(task, port)) != port:
                        self.task_store_port(task, served)
                case TellStore(task, moved_from, address, nodes):
                    for node in nodes:
                        self.orders.add(node, StoreMoved(task=task, moved_from=moved_from, address=address))
                case Launched(task, generation, workers, port):
                    self.task_launched(task, generation, workers, port, now)

    def _noted_end(self, task: str) -> None:
        self.happened.note(TaskDone(task))
        self._ended.append(task)

    def next_ended(self) -> str | None:
        """The task that ended first of those not yet taken (None: none): taken one at a time, so
        that one whose freeing fails leaves the others to be taken."""
        return self._ended.pop(0) if self._ended else None

    def put_back_posts(self, now: float) -> None:
        """About once a second, write every live task's kept values again, which puts back
        what someone deleted or replaced in its rendezvous store (``Rendezvous.restore``). The
        values found missing are recorded as ``store_values_restored`` at once, then at most once
        a minute per task while it goes on (with the count since the last record): an attack does
        not fill the event log. A replaced value is put back but not counted (it is not read).
        The writes are the poster's (off the loop); what they found is recorded on the next call."""
        self._said_put_back(now)
        if now < self._put_back_due - PUT_BACK_EVERY_S:
            self._put_back_due = now  # the clock was stepped back: do not wait for it to catch up
        if now < self._put_back_due:
            return
        self._put_back_due = now + PUT_BACK_EVERY_S
        self.posts.put_back(tuple(t.name for t in self._store.tasks(live_only=True)))
        self._said_put_back(now)  # (made at once without a journal: a store stepped by hand)

    def _said_put_back(self, now: float) -> None:
        """Record what the put-backs made since the last call found missing (the poster's thread
        makes them, ``posting.py``), as ``put_back_posts`` says."""
        for name, keys in self.posts.restored():
            if (task := self._store.task(name)) is None or not task.state.live:
                continue  # (said when it ended)
            told = self._put_back.get(name)
            if keys and told is None:
                told = self._put_back[name] = PutBack(said_at=now - PUT_BACK_SAID_EVERY_S)
            if told is None:
                continue
            told.count, told.keys = told.count + len(keys), sorted({*told.keys, *keys})[:8]
            if told.count and now - told.said_at >= PUT_BACK_SAID_EVERY_S:
                self.record("store_values_restored", task=name, values=told.count, keys=told.keys)
                told.count, told.keys, told.said_at = 0, [], now
            elif not told.count and now - told.said_at >= PUT_BACK_SAID_EVERY_S:
                del self._put_back[name]  # quiet for a minute: the next one is said at once

    def node_registered(self, reg: Registration, state: NodeState, now: float) -> None:
        """A node registered (anew, or again after a loss or a restart of its agent) in ``state``."""
        known = self._store.node(reg.node)
        self._store.node_registered(
            reg.node, reg.slots, reg.gpus, reg.host, state, now, reg.probe_port, reg.domain
        )
        row = self._store.node(reg.node)
        assert row is not None  # (just written)
        self.happened.node_moved(row.id, None if known is None else known.state, state)

    def node_state(self, node: str, to: NodeState) -> None:
        """Move a node to ``to``; its leaving service or coming back is a cluster event."""
        row = self._store.node(node)
        self._store.node_state(node, to)
        if row is not None:
            self.happened.node_moved(row.id, row.state, to)

    def node_out_of_service(self, node: str, state: NodeState, event: str, **detail: Any) -> None:
        """An admin drained a node or put it back (``control/place/draining.py``)."""
        self.node_state(node, state)
        self.record(event, node=node, **detail)

    def remove_node(self, node: str, why: str = "an admin removed it") -> None:
        """A lost node's record and its order queue go (control.removal)."""
        self._store.remove_node(node)
        self.orders.take(node)
        self.record("node_removed", node=node, why=why)

    def node_lost(self, node: str, silent_s: float, late_s: float, deadline_s: float) -> list[WorkerRecord]:
        """A node went silent: it is lost, with its live workers (returned as they were), and
        its unsent orders mean nothing any more. The record says how long it was silent, how
        much of that was the coordinator's own lateness, and the deadline it was judged by
        (``detect/nodewatch.py:Silent``)."""
        self.node_state(node, NodeState.LOST)
        late, deadline = round(late_s, 3), round(deadline_s, 3)
        self.record("node_lost", node=node, silent_s=round(silent_s, 3), late_s=late, deadline_s=deadline)
        self.orders.take(node)
        return self._store.lose_node_workers(node)

    def task_ended(self, name: str, to: TaskState, now: float, reason: str | None = None) -> None:
        self._said_put_back(now)  # (what the poster found for it while it lived is its own)
        self._store.task_ended(name, to, now, reason)
        self._noted_end(name)
        told = self._put_back.pop(name, None)
        if told is not None and told.count:  # what was put back since the last record is said
            self.record("store_values_restored", task=name, values=told.count, keys=told.keys)
        if self._store.kept_record(Posted, of=name) is not None:
            self._store.drop_record(Posted, of=name)

    def task_launched(self, task: str, generation: int, workers: int, port: int, now: float) -> None:
        """A generation was launched from a checkpoint: it is the task's current one."""
        self._store.task_launched(task, generation, workers, port, now)
        self.generation_current(task, generation)

    def generation_current(self, task: str, generation: int) -> None:
        """Tell the task's workers which generation is current: only its members commit
        checkpoints (``train/fencing.py``)."""
        record = self._store.task(task)
        launched = generation if record is None else min(generation, record.launched_generation)
        current = Current(generation=generation, launched=launched)
        self.posts.post(task, current_key(task), current.model_dump_json())  # once durable

    def host_task_stores(self) -> list[tuple[TaskRecord, int]]:
        """A coordinator starting over a kept store hosts each live task's rendezvous store again
        (its port kept where it can be), posts what it had posted there again (``Posted``), and
        tells its workers the store is new. The new store
        forgot which generation-0 faults were claimed: those the event log shows injected are
        claimed again, so that none strikes twice. Returns each task (as it was) whose kept port
        was taken, with the port its store is served on now, where its running workers do not
        look for it (``brain/takeover.py`` decides what follows: they are told)."""
        moved: list[tuple[TaskRecord, int]] = []
        for task in self._store.tasks(live_only=True):
            if not task.store_port:
                continue
            port = self.rendezvous.host(task.name, task.store_port)
            if port != task.store_port:
                self.task_store_port(task.name, port)
                moved.append((task, port))
            for key, value in (self._store.kept_record(Posted, of=task.name) or Posted()).keys.items():
                self.rendezvous.set(task.name, key, value)
            self.generation_current(task.name, task.generation)
            for e in self._store.events(task=task.name, kinds=("fault_injected",), limit=1_000_000):
                # (not those of an earlier task of the name, which ended before this one came)
                if e.detail.get("index") is not None and e.time >= task.submitted:
                    self.rendezvous.claim(task.name, int(e.detail["index"]))
        return moved

    def launch(self, launch: Launch, now: float) -> list[WorkerRecord]:
        added = self._store.add_workers(
            launch.task,
            launch.generation,
            launch.placement,
            launch.first_rank,
            launch.phase,
            now,
            launch.joining,
        )
        for w in added:
            self.orders.add(
                w.node,
                LaunchWorker(
                    task=w.task,
                    generation=w.generation,
                    rank=w.rank,
                    world_size=launch.world_size,
                    local_rank=w.local_rank,
                    argv=list(launch.argv),
                    env={**launch.env, KEYS["rank"]: str(w.rank)},
                ),
            )
        return added

    def stop_worker(self, w: WorkerRecord, grace_s: float) -> None:
        self.stop(w.node, w.task, w.generation, w.rank, grace_s)

    def stop(self, node: str, task: str, generation: int, rank: int, grace_s: float) -> None:
        """Exactly that worker (a generation-wide stop could hit a survivor mid-rename)."""
        self.orders.add(node, StopWorkers(task=task, generation=generation, rank=rank, grace_s=grace_s))

    def dump_stacks(self, task: str, generation: int, peers: dict[str, str] | None = None) -> None:
        """Every node running the generation dumps its workers' stacks (before any stop that
        follows: the agent carries orders out in turn), and probes ``peers`` if given."""
        for node in sorted({w.node for w in self._store.workers(task, generation, live=True)}):
            self.orders.add(node, DumpStacks(task=task, generation=generation, peers=peers or {}))

    def stop_generation(self, task: str, generation: int, grace_s: float) -> None:
        """Every live worker of the generation, on nodes that can still hear it."""
        reachable = {n.name for n in self._store.nodes() if n.state is not NodeState.LOST}
        for node in sorted({w.node for w in self._store.workers(task, generation, live=True)} & reachable):
            self.orders.add(node, StopWorkers(task=task, generation=generation, grace_s=grace_s))

    def stop_node(self, node: str, grace_s: float) -> None:
        for task, generation in sorted({(w.task, w.generation) for w in self._store.live_workers_on(node)}):
            self.orders.add(node, StopWorkers(task=task, generation=generation, grace_s=grace_s))

    def switch(self, switch: Switch, now: float) -> None:
        kept = switch.renamed()
        self._store.switch_generation(switch.task, switch.old, switch.membership.generation, kept, now)
        new, renamed = switch.membership.generation, defaultdict[tuple[str, int], dict[int, int]](dict)
        for w, rank in kept:
            renamed[w.node, w.generation][w.rank] = rank
        for (node, generation), ranks in renamed.items():  # one order per node
            # Built unvalidated: its values are the membership's, validated as it was made (a
            # validation per node was a tenth of a switch of 160 workers on 20 nodes).
            order = RenameWorkers.model_construct(
                task=switch.task, generation=generation, new_generation=new, ranks=ranks
            )
            self.orders.add(node, order)
        payload = switch.membership.model_dump_json()
        self._post(switch.task, membership_key(switch.task, switch.old), payload)
        self.generation_current(switch.task, switch.membership.generation)  # after the path to it

    def use_spare(
        self,
        task: str,
        spare_rank: int,
        node: str,
        local: int,
        generation: int,
        rank: int,
        world: int,
        now: float,
    ) -> None:
        """A hot spare becomes a newcomer: no process to start, only a new identity."""
        self._store.spare_used(task, spare_rank, generation, rank, node, local, now)
        self.orders.add(
            node,
            RenameWorkers(
                task=task, generation=SPARE_GENERATION, new_generation=generation, ranks={spare_rank: rank}
            ),
        )
        identity = {"generation": generation, "rank": rank, "world_size": world}
        self._post(task, spare_key(task, spare_rank), json.dumps(identity))

    def _post(self, task: str, key: str, value: str) -> None:
        """Post ``key`` in the task's store for its workers, kept (``Posted``) so that a
        coordinator starting over posts it again; durable before any worker can read it."""
        posted = self._store.kept_record(Posted, of=task) or Posted()
        mine = {**posted.keys, key: value}  # JSON keeps the order: oldest first
        self._store.keep_record(Posted(keys=dict(list(mine.items())[-POSTED_PER_TASK:])), of=task)
        self.posts.post(task, key, value)  # (written once the record above is durable)

    def forget_task(
        self, task: str, checkpoint_dir: Path, env: dict[str, str], only: str | None = None
    ) -> None:
        """Every node (or ``only`` that one) frees what it keeps for an ended task."""
        for node in self._store.nodes():
            if node.state is not NodeState.LOST and only in (None, node.name):
                order = ForgetTask(
                    task=task,
                    checkpoint_dir=str(checkpoint_dir),
                    host_checkpoint_root=env.get(KEYS["host_checkpoint_root"]),
                )
                self.orders.add(node.name, order)

    def drop_spare(self, task: str, rank: int, node: str, stop: bool) -> None:
        if stop:
            self.orders.add(node, StopWorkers(task=task, generation=SPARE_GENERATION, rank=rank, grace_s=0.0))
        self._store.worker_phase((task, SPARE_GENERATION, rank), WorkerPhase.STOPPED)

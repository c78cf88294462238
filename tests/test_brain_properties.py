"""The coordinator's decisions as values, over random sequences of events (hypothesis).

One task ("lm", 4 ranks) on two nodes of 2 slots, stepped by hand with the fake clock of
``tests/fakecluster.py``, goes through 5-25 drawn actions: a worker's exit, an exception report
of any ``ErrorKind``, every worker killed at once, a node silent for a while (lost, or not yet)
that comes back (its processes kept, or gone with a reboot), training steps, a checkpoint of
rank 0, a coordinator restart, and time passing without steps (recovery deadlines, hangs). Then
time passes with training until things settle. After every action (and every settling round)
the invariants below are checked; a restart also compares the state before and after it.

The agents are those of ``fakecluster.Cluster`` with three changes, so that the agents' side
stays faithful over long random runs: a silent node neither sends nor receives anything (the
harness's long polls would carry its orders out meanwhile); a stop order stops what a real
agent's ``Supervisor.stop`` stops (a generation-wide one too: every generation up to the one named)
and the exits follow, marked ``stop_ordered``, with the node's next heartbeat; and nothing
depends on the machine's timing, which hypothesis would call flaky: the plan table being built
in the background is waited for before each tick, and the coordinator's own loop is timed by
the fake clock (by the real one, a slow example read as a stalled coordinator).
"""

from __future__ import annotations

import tempfile
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, note, settings
from hypothesis import strategies as st

from unicron.brain.records import EventRecord
from unicron.control.coordinator import Coordinator, CoordinatorSettings
from unicron.control.recover.storagewatch import CONTINUE_FROM_MEMORY
from unicron.core.livespecs import parse_live_tasks
from unicron.core.protocol import (
    CheckpointReport,
    ExceptionReport,
    ExitReport,
    OrderBatch,
    Registration,
    StopWorkers,
    WorkerReport,
    WorkerState,
)
from unicron.core.settings import Settings
from unicron.core.states import SLOT_HOLDING_PHASES, NodeState, TaskState
from unicron.core.taxonomy import ErrorKind
from unicron.core.tiers import Tier

from .fakecluster import SPEC, Clock, Cluster

NODES = ("n0", "n1")
TASK = "lm"
RESTART_S = 0.5  # how long a coordinator's restart takes here
LAST_STEP = 90  # the spec's 100 iterations are never reached: the task does not finish here
LABELS = {t.label: t for t in Tier}
LIMITS: dict[str, Any] = {
    "recovery_deadline_s": 3.0,
    "isolation_s": 30.0,
    "hang_cap_s": 8.0,  # a hang before the step times are known is found within the run
    "first_step_timeout_s": 8.0,
    "start_timeout_s": 8.0,  # these workers report no position: a launch never trained is stuck starting
    "restart_stop_wait_s": 3.0,
}


# ---------------------------------------------------------------------------- the agents
@dataclass
class Agents(Cluster):
    """``fakecluster.Cluster`` with silent nodes, real stops and their exits (module docstring)."""

    silent: set[str] = field(default_factory=set)
    outbox: dict[str, list[WorkerReport]] = field(default_factory=dict)  # exits for the next beat

    def beat(self, node: str, *reports: WorkerReport) -> None:
        known = self.c.store.node(node)
        queued = [] if known is None or known.state is NodeState.LOST else self.outbox.pop(node, [])
        super().beat(node, *queued, *reports)

    def _follow(self, node: str, batch: OrderBatch) -> None:
        if node not in self.silent:  # a silent node hears nothing either
            super()._follow(node, batch)

    def _stopped(self, node: str, order: StopWorkers) -> None:
        """What ``Supervisor.stop`` chooses, terminated at once; its exits go with the next beat."""
        for (t, g, r), (where, _) in sorted(self.running.items()):
            if where != node or t != order.task:
                continue
            if order.generation is not None and (
                g != order.generation if order.rank is not None else g > order.generation
            ):
                continue
            if order.rank is not None and r != order.rank:
                continue
            del self.running[(t, g, r)]
            gone = ExitReport(
                task=t,
                generation=g,
                rank=r,
                node=node,
                code=None,
                signal=15,
                time=self.clock.now,
                stop_ordered=True,
            )
            self.outbox.setdefault(node, []).append(gone)

    def step(self, seconds: float = 0.5) -> None:
        self.clock.now += seconds
        for node in NODES:
            known = self.c.store.node(node)
            if node not in self.silent and known is not None and known.state is not NodeState.LOST:
                self.beat(node)
        self.c.placer.allocator.wait()
        self.c.tick()
        for node in NODES:
            self._follow(node, self.c.orders(node, self.acked.get(node, 0)))

    def restart(self) -> None:
        self.c.shutdown()
        self.c = Coordinator(self.settings, self.clock, loop_clock=self.clock)

    def states(self, node: str) -> list[WorkerState]:
        return [
            WorkerState(task=t, generation=g, rank=r, pid=pid, running=True)
            for (t, g, r), (n, pid) in sorted(self.running.items())
            if n == node
        ]


@contextmanager
def cluster_of(recovery: str) -> Iterator[Agents]:
    """``fakecluster.make_cluster``'s ``build`` with these agents, in a folder of its own."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        clock = Clock()
        config = CoordinatorSettings(
            state_dir=root / "state", checkpoint_root=root / "ckpt", limits=Settings(**LIMITS)
        )
        cluster = Agents(Coordinator(config, clock, loop_clock=clock), clock, config)
        try:
            for node in NODES:
                cluster.c.register(Registration(node=node, slots=2))
            cluster.c.submit(*parse_live_tasks(SPEC.format(recovery=recovery, run_extra=""), "test"))
            cluster.c.placer.allocator.wait()
            cluster.step()
            cluster.step()
            cluster.train(1)
            assert cluster.c.store.get_task(TASK).state is TaskState.RUNNING
            yield cluster
        finally:
            cluster.c.shutdown()


# ---------------------------------------------------------------------------- the actions
@dataclass(frozen=True)
class Exit:
    pick: int  # which running rank of the current generation (modulo their number)
    killed: bool  # by signal 9; else exit code 1


@dataclass(frozen=True)
class Raise:
    pick: int
    kind: ErrorKind
    then_exit: bool  # the process exits with code 1 after reporting it


@dataclass(frozen=True)
class KillAll:
    pass


@dataclass(frozen=True)
class Silent:
    node: str
    ticks: int  # 0.5 s each: 6 s or more and it is declared lost
    reboot: bool  # it comes back without its processes (else they ran on meanwhile)


@dataclass(frozen=True)
class Train:
    steps: int


@dataclass(frozen=True)
class Checkpoint:
    pass


@dataclass(frozen=True)
class Restart:
    pass


@dataclass(frozen=True)
class Idle:
    ticks: int


Action = Exit | Raise | KillAll | Silent | Train | Checkpoint | Restart | Idle

ACTIONS = st.one_of(
    st.builds(Exit, st.integers(0, 3), st.booleans()),
    st.builds(Raise, st.integers(0, 3), st.sampled_from(list(ErrorKind)), st.booleans()),
    st.just(KillAll()),
    st.builds(Silent, st.sampled_from(NODES), st.integers(1, 16), st.booleans()),
    st.builds(Train, st.integers(1, 3)),
    st.just(Checkpoint()),
    st.just(Restart()),
    st.builds(Idle, st.integers(1, 12)),
)


@dataclass
class Model:
    """What the test itself did: the steps trained and checkpointed, where the workers are."""

    position: int = 1  # the step the current workers' state is at
    trained: int = 1  # the highest step any worker reported
    durable: int = 0  # the newest checkpoint reported (by rank 0)
    launched: int = -1  # the launch the position follows
    launches_checked: int = 0  # task_launch events already checked

    def follow(self, cluster: Agents) -> None:
        """A generation launched anew resumes from the checkpoint its launch names."""
        task = cluster.c.store.get_task(TASK)
        if task.launched_generation != self.launched:
            self.launched = task.launched_generation
            for e in events(cluster, "task_launch"):
                if e.detail["generation"] == task.launched_generation:
                    self.position = int(e.detail["resume_from"])


def events(cluster: Agents, kind: str | None = None) -> list[EventRecord]:
    return [e for e in cluster.c.store.events(limit=10**9) if kind is None or e.kind == kind]


def current(cluster: Agents) -> list[tuple[int, str]]:
    """(rank, node) of the current generation's processes on nodes that are heard."""
    task = cluster.c.store.get_task(TASK)
    return [
        (r, node)
        for (t, g, r), (node, _) in sorted(cluster.running.items())
        if t == TASK and g == task.generation and node not in cluster.silent
    ]


def exit_of(cluster: Agents, key: tuple[str, int, int], code: int | None, signal: int | None) -> None:
    node, _ = cluster.running.pop(key)
    report = ExitReport(
        task=key[0],
        generation=key[1],
        rank=key[2],
        node=node,
        code=code,
        signal=signal,
        time=cluster.clock.now,
    )
    cluster.beat(node, report)


def train(cluster: Agents, model: Model, steps: int) -> None:
    for _ in range(steps):
        model.follow(cluster)
        task = cluster.c.store.get_task(TASK)
        if task.state.active and current(cluster) and model.position < LAST_STEP:
            model.position += 1
            model.trained = max(model.trained, model.position)
            cluster.train(model.position)
        cluster.step(0.5)


def act(cluster: Agents, model: Model, action: Action, compare: bool) -> None:
    """Carry ``action`` out; ``compare``: a restart is checked to restore an equal state (6)."""
    task = cluster.c.store.get_task(TASK)
    ranks = current(cluster)
    if isinstance(action, Exit) and ranks:
        rank, _ = ranks[action.pick % len(ranks)]
        code, signal = (None, 9) if action.killed else (1, None)
        exit_of(cluster, (TASK, task.generation, rank), code, signal)
    elif isinstance(action, Raise) and ranks:
        rank, node = ranks[action.pick % len(ranks)]
        _, pid = cluster.running[(TASK, task.generation, rank)]
        report = ExceptionReport(
            task=TASK,
            generation=task.generation,
            rank=rank,
            step=model.position,
            error_type="RuntimeError",
            message="drawn",
            kind=action.kind.value,
            time=cluster.clock.now,
        )
        cluster.beat(node, report)
        if action.then_exit:  # under the identity its agent knows it by now (renamed, maybe)
            key = next((k for k, v in cluster.running.items() if v == (node, pid)), None)
            if key is not None:
                exit_of(cluster, key, 1, None)
    elif isinstance(action, KillAll):
        reports: dict[str, list[WorkerReport]] = {}
        for (t, g, r), (node, _) in sorted(cluster.running.items()):
            if t == TASK:
                gone = ExitReport(
                    task=t, generation=g, rank=r, node=node, code=None, signal=9, time=cluster.clock.now
                )
                reports.setdefault(node, []).append(gone)
                del cluster.running[(t, g, r)]
        for node, gone_there in reports.items():
            cluster.beat(node, *gone_there)
            cluster.clock.now += 0.05
    elif isinstance(action, Silent):
        cluster.silent.add(action.node)
        for _ in range(action.ticks):
            cluster.step(0.5)
        cluster.silent.discard(action.node)
        if action.reboot:
            for key in [k for k, (n, _) in cluster.running.items() if n == action.node]:
                del cluster.running[key]
        known = cluster.c.store.node(action.node)
        if action.reboot or (known is not None and known.state is NodeState.LOST):
            reg = Registration(node=action.node, slots=2, workers=cluster.states(action.node))
            cluster.c.register(reg)
        cluster.step(0.5)
    elif isinstance(action, Train):
        train(cluster, model, action.steps)
    elif isinstance(action, Checkpoint):
        zero = [node for rank, node in ranks if rank == 0]
        if task.state.active and zero:
            saved = CheckpointReport(
                task=TASK, generation=task.generation, rank=0, step=model.position, path="ckpt"
            )
            model.durable = max(model.durable, model.position)
            cluster.beat(zero[0], saved)
    elif isinstance(action, Restart):
        # The new coordinator takes a while to start: an isolation that ends meanwhile has ended
        # for both (the state before is read for when the successor starts).
        before = restored(cluster, at=cluster.clock.now + RESTART_S)
        cluster.clock.now += RESTART_S
        cluster.restart()
        if compare:
            check_restored(before, restored(cluster))
    elif isinstance(action, Idle):
        for _ in range(action.ticks):
            cluster.step(0.5)


# ---------------------------------------------------------------------------- the invariants
def check_slots(cluster: Agents) -> None:
    """1. No slot given twice: on each node, the rows that hold a slot (launching or running
    workers of every generation of every task, and waiting hot spares: ``SLOT_HOLDING_PHASES``)
    are at most its slots, each on a device index of its own below the slots; the store's
    index of them (``slots_in_use``) agrees with the rows."""
    store = cluster.c.store
    holding = [w for t in store.tasks() for w in store.workers(t.name) if w.state in SLOT_HOLDING_PHASES]
    for node in store.nodes():
        there = [w for w in holding if w.node == node.name]
        assert len(there) <= node.slots, f"{node.name} holds {len(there)} of {node.slots} slots: {there}"
        devices = [w.local_rank for w in there]
        assert len(set(devices)) == len(devices), f"a device of {node.name} given twice: {there}"
        assert all(0 <= d < node.slots for d in devices), f"a device past {node.name}'s slots: {there}"
    assert store.slots_in_use() == dict(Counter(w.node for w in holding))


def check_generations(cluster: Agents) -> None:
    """2. Every live (launching or running) row of a task is in its current generation, or, only
    while a grow is under way, is one of that grow's newcomers (its generation, its ranks). No
    (task, rank) is live in two generations at once, and no process (node, pid) is live under
    two identities. A survivor renamed in place needs no exception: ``switch_generation`` makes
    its old row MOVED (not live) in the commit that writes its new one."""
    for task in cluster.c.store.tasks():
        live = cluster.c.store.workers(task.name, live=True)
        growth = cluster.c.generations.growing.get(task.name)
        for w in live:
            newcomer = growth is not None and w.generation == growth.generation and w.rank in growth.newcomers
            assert w.generation == task.generation or newcomer, (
                f"{w.key} is live; the task is in generation {task.generation}, growing: {growth}"
            )
        twice = [r for r, n in Counter(w.rank for w in live).items() if n > 1]
        assert not twice, f"rank(s) {twice} of {task.name} live in two generations: {live}"
        processes = Counter((w.node, w.pid) for w in live if w.pid is not None)
        assert all(n == 1 for n in processes.values()), f"a process live under two identities: {live}"


def check_incidents(cluster: Agents, log: list[EventRecord]) -> None:
    """3. An incident stays open until its tier completes or it ends: every incident event has
    exactly one outcome (recovered, superseded, task failed, task ended) or none and is open
    (in ``recovery.incidents``, or for the storage's own incidents in ``storage.open``); no
    open incident has an outcome; at most one is open per task."""
    opened = {e.id: e for e in log if e.kind == "incident"}
    outcomes = Counter(e.detail.get("incident") for e in log if e.kind == "outcome")
    open_now = [i.id for i in cluster.c.recovery.incidents.values()]
    open_now += [o.incident for o in cluster.c.storage.open.values()]
    assert set(outcomes) <= set(opened), "an outcome of no incident"
    assert set(open_now) <= set(opened), "an open incident never recorded"
    for incident_id, e in opened.items():
        assert outcomes[incident_id] <= 1, f"incident {incident_id} has {outcomes[incident_id]} outcomes"
        if outcomes[incident_id] == 0:
            assert incident_id in open_now, f"incident {incident_id} has no outcome and is not open: {e}"
        else:
            assert incident_id not in open_now, f"incident {incident_id} is open and has an outcome"
    per_task = Counter(task for task, _ in cluster.c.recovery.incidents)
    assert all(n == 1 for n in per_task.values()), f"several open: {cluster.c.recovery.incidents}"


def check_tiers(cluster: Agents, log: list[EventRecord]) -> None:
    """4. The tiers recorded are tiers: every incident's ``action`` and ``asked``, every
    escalation's ``from_action`` and ``to_action``, are labels of ``Tier`` (but the storage
    watch's own ``continue_from_memory`` incidents, which no ladder decides). Each escalation
    goes one tier up; the carried ones of an incident go strictly upward from its action, and
    that chain is the open incident's ``tiers`` and the ``actions`` of its outcome."""
    chains: dict[int, list[Tier]] = {}
    for e in log:
        if e.kind == "incident" and e.detail["action"] != CONTINUE_FROM_MEMORY:
            assert e.detail["action"] in LABELS and e.detail["asked"] in LABELS, e.detail
            chains[e.id] = [LABELS[e.detail["action"]]]
        elif e.kind == "escalation":
            assert e.detail["from_action"] in LABELS and e.detail["to_action"] in LABELS, e.detail
            low, high = LABELS[e.detail["from_action"]], LABELS[e.detail["to_action"]]
            assert high is low.next() and high > low, f"escalation {e.id} does not step up: {e.detail}"
            if e.detail["carried"]:
                chain = chains[e.detail["incident"]]
                assert high > chain[-1], f"escalation {e.id} carried {high.label} after {chain}"
                chain.append(high)
        elif e.kind == "outcome" and e.detail.get("incident") in chains and "actions" in e.detail:
            recorded = [LABELS[a] for a in e.detail["actions"]]
            assert recorded == chains[e.detail["incident"]], f"outcome {e.id}: {e.detail}"
    for incident in cluster.c.recovery.incidents.values():
        assert incident.tiers == chains[incident.id], f"{incident} against {chains[incident.id]}"


def check_steps(cluster: Agents, model: Model, log: list[EventRecord]) -> None:
    """5. No task resumes past its newest durable state: every launch (the first, or a restart
    from the checkpoint) resumes from a step no newer than the newest checkpoint rank 0
    reported; the coordinator's step is one the workers trained, its checkpoint step one they
    saved, and ``checkpoint_step <= step`` (as are the steps a relaunch trains again)."""
    task = cluster.c.store.get_task(TASK)
    assert 0 <= task.checkpoint_step <= task.step <= model.trained, (task, model)
    assert task.checkpoint_step <= model.durable, (task, model)
    assert task.redo_until <= task.step, task
    launches = [e for e in log if e.kind == "task_launch"]
    for e in launches[model.launches_checked :]:
        assert int(e.detail["resume_from"]) <= model.durable, f"{e.detail} past step {model.durable}"
    model.launches_checked = len(launches)


def check(cluster: Agents, model: Model) -> None:
    log = events(cluster)
    check_slots(cluster)
    check_generations(cluster)
    check_incidents(cluster, log)
    check_tiers(cluster, log)
    check_steps(cluster, model, log)


def restored(cluster: Agents, at: float | None = None) -> dict[str, Any]:
    """6. What a coordinator's decisions go by, for comparison across a restart. Ignored, as
    legitimately its own process's: a node's ``last_seen`` (held in memory between its other
    changes; a new coordinator gives every node a full deadline, ``store.py``), an incident's
    ``deadline`` (given afresh on a restart, ``Recovery.rebuild``). Compared: the open
    incidents (every other field), the ladder's history, the tasks, the nodes, the workers
    (a grow's newcomers included), the grows and shrinks under way, the isolations still
    running at ``at`` (default: now), the spares and the storage's open incidents."""
    c, now = cluster.c, cluster.clock.now if at is None else at
    tasks = c.store.tasks()
    return {
        "incidents": {
            k: (i.id, i.kind, i.detected, list(i.tiers), i.generation, i.formed, sorted(i.stuck_nodes))
            for k, i in c.recovery.incidents.items()
        },
        "ladder": c.recovery.ladder,  # (its counts: the old coordinator is not stepped again)
        "tasks": tasks,
        "nodes": [replace(n, last_seen=0.0) for n in c.store.nodes()],
        "workers": [w for t in tasks for w in c.store.workers(t.name)],
        "in_flight": c.generations.in_flight(),
        "isolated": {
            n: until for n, until in c.recovery.isolated_until.items() if until is None or until > now
        },  # (None: until an operator resumes it)
        "spares": sorted(c.placer.spares),
        "storage": dict(c.storage.open),
    }


def check_restored(before: dict[str, Any], after: dict[str, Any]) -> None:
    assert after["incidents"] == before["incidents"], "the open incidents"
    assert after["ladder"] == before["ladder"], "the ladder's history"
    assert after["tasks"] == before["tasks"], "the tasks"
    assert after["nodes"] == before["nodes"], "the nodes"
    assert after["workers"] == before["workers"], "the workers"
    assert after["in_flight"] == before["in_flight"], "the grows and shrinks under way"
    assert after["isolated"] == before["isolated"], "the isolations under way"
    assert after["spares"] == before["spares"], "the spares"
    assert after["storage"] == before["storage"], "the storage's incidents"


# ---------------------------------------------------------------------------- the properties
def play(recovery: str, actions: list[Action], invariants: bool, compare: bool) -> None:
    """The actions, then time passing (training where the task can), checking invariants 1-5
    after each (``invariants``) and 6 at each restart (``compare``); once settled, with a task
    still live, every cluster event was answered by a plan (none is still being solved)."""
    with cluster_of(recovery) as cluster:
        model = Model()
        model.follow(cluster)
        if invariants:
            check(cluster, model)
        for action in actions:
            act(cluster, model, action, compare)
            if invariants:
                check(cluster, model)
        for _ in range(20 if invariants else 0):
            train(cluster, model, 1)
            cluster.step(0.5)
            check(cluster, model)
        if invariants and cluster.c.store.tasks(live_only=True):
            # Settled: every cluster event was answered by a plan, none is still being solved.
            allocator = cluster.c.placer.allocator
            assert not allocator.unanswered() and allocator.solving is None, allocator.happened


RUNS = settings(
    max_examples=100,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
RECOVERY = st.sampled_from(["in_process", "restart"])
SEQUENCES = st.lists(ACTIONS, min_size=5, max_size=25)


@settings(RUNS, max_examples=200)
@given(recovery=RECOVERY, actions=SEQUENCES)
def test_the_coordinators_decisions_keep_their_invariants(recovery: str, actions: list[Action]) -> None:
    """Invariants 1-5 (``check_slots``, ``check_generations``, ``check_incidents``,
    ``check_tiers``, ``check_steps``) after every action and every round of the time after."""
    note(f"recovery={recovery!r}, actions={actions!r}")  # (this hypothesis prints them empty)
    play(recovery, actions, invariants=True, compare=False)


@RUNS
@given(recovery=RECOVERY, actions=SEQUENCES.filter(lambda a: Restart() in a))
def test_a_coordinator_restart_restores_an_equal_state(recovery: str, actions: list[Action]) -> None:
    """Invariant 6 (``restored``) at every restart among the actions."""
    note(f"recovery={recovery!r}, actions={actions!r}")
    play(recovery, actions, invariants=False, compare=True)


# The minimal sequences hypothesis shrank the failures above to (their lists are 5 long at
# least: the filler is left out here), replayed every run whatever the random search draws.
FOUND: dict[str, tuple[str, list[Action]]] = {
    # A survivor's peer error waits for its cause; meanwhile the recovery in place misses its
    # deadline and escalates to a restart from the checkpoint, whose stop cannot finish (the
    # node with rank 0 is silent). When the wait runs out, ``expire_awaiting`` opens a new
    # incident on the restarting task; its in-place tier asks restarting -> starting:
    # ``IllegalTransition`` out of ``Coordinator.tick``, half-way: the new incident is recorded
    # and supersedes the open one, its tier never carried out.
    "a peer error outlives its generation's restart": (
        "in_process",
        [Exit(0, False), Raise(0, ErrorKind.NCCL_TIMEOUT, False), Silent("n0", 7, False)],
    ),
    # Two exits on n0 isolate it for isolation_s (30 s); a restart 1.5 s later forgets when
    # the isolation ends (``Recovery.isolated_until`` is kept nowhere), so the successor's
    # first tick ends it: "node_back: isolation over" about 29 s early (invariant 6).
    "an isolation survives a restart": (
        "in_process",
        [Exit(0, False), Train(1), Exit(0, False), Restart()],
    ),
    # An isolation ending while the coordinator restarts ran out for the successor too: the
    # comparison counted it running before (when the old one stopped) and not after (when the
    # new one started). The test's own boundary, not the coordinator's (found 12-02).
    "an isolation that ends during a restart": (
        "in_process",
        [
            Raise(0, ErrorKind.NODE_LOST, False),
            *[Silent("n0", ticks, False) for ticks in (1, 1, 2, 2, 8, 13)],
            Train(3),
            Silent("n0", 16, False),
            Train(3),
            Train(3),
            Restart(),
        ],
    ),
    # The task restarting from its checkpoint loses n0: ``root_cause`` makes the open
    # incident's kind node_lost, in memory only (not kept), so the successor restores it as
    # exited_abnormally (invariant 6).
    "a root cause survives a restart": (
        "restart",
        [Train(3), Exit(0, False), Silent("n0", 6, False), Restart()],
    ),
}


@pytest.mark.parametrize("name", sorted(FOUND))
def test_the_sequences_found_keep_the_invariants(name: str) -> None:
    recovery, actions = FOUND[name]
    play(recovery, actions, invariants=True, compare=True)

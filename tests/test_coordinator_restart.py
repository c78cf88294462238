"""The coordinator's logic across its own restarts and stalls, stepped by hand (a fake clock,
agents played by the test): what a coordinator started over a kept store restores (incidents,
fault claims, the ladder, measured rates, spares), an old store's schema, and a paused loop.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from unicron.brain.effects import Record
from unicron.brain.takeover import store_moved
from unicron.control.recover.storagewatch import Opened
from unicron.core.kept import FaultSigns, InFlight, NodeErrors, StorageIncidents, TaskLadder
from unicron.core.ladder import Counted, Ladder
from unicron.core.protocol import (
    AGENT_RETRY_CAP_S,
    CheckpointReport,
    ExitReport,
    FaultReport,
    NumericalReport,
    Phase,
    Progress,
    StopWorkers,
    StorageReport,
    StoreMoved,
    fault_claim_key,
    ready_key,
)
from unicron.core.settings import Settings
from unicron.core.states import NodeState, TaskState
from unicron.core.taxonomy import ErrorKind
from unicron.core.tiers import Tier
from unicron.core.workerenv import KEYS


def test_a_store_written_before_new_columns_opens(tmp_path: Path) -> None:
    import sqlite3

    from unicron.control.store.sqlitebackend import SqliteBackend
    from unicron.control.store.store import Store

    path = tmp_path / "old.sqlite"
    old = sqlite3.connect(path)
    old.execute(
        "CREATE TABLE tasks (name TEXT PRIMARY KEY, spec TEXT NOT NULL, state TEXT NOT NULL, "
        "generation INTEGER NOT NULL DEFAULT 0, workers INTEGER NOT NULL DEFAULT 0, "
        "step INTEGER NOT NULL DEFAULT 0, checkpoint_step INTEGER NOT NULL DEFAULT 0, "
        "store_port INTEGER NOT NULL DEFAULT 0, failures INTEGER NOT NULL DEFAULT 0, "
        "restarts INTEGER NOT NULL DEFAULT 0, down_since REAL, downtime_s REAL NOT NULL DEFAULT 0, "
        "samples INTEGER NOT NULL DEFAULT 0, flop REAL NOT NULL DEFAULT 0, digest TEXT, "
        "submitted REAL NOT NULL, started REAL, finished REAL)"
    )
    old.execute("INSERT INTO tasks (name, spec, state, submitted) VALUES ('t', '{}', 'running', 0)")
    old.commit()
    old.close()
    store = Store(SqliteBackend(path))
    task = store.get_task("t")
    assert task.state is TaskState.RUNNING and task.reason is None and task.launched_generation == 0
    store.close()


def test_an_incident_open_across_a_coordinator_restart_is_recovered_or_escalated(make: Any) -> None:
    """The coordinator is killed while survivors recover in place. Started again, it knows the
    incident from its log: a step regained closes it (once); a recovery that regains none by
    the deadline escalates as it would have without the restart."""
    cluster = make(recovery_deadline_s=10.0)
    cluster.exit(1)
    cluster.restart()
    cluster.step(0.5)
    cluster.train(2)
    (outcome,) = cluster.events("outcome")
    assert outcome["outcome"] == "recovered" and outcome["actions"] == ["restart failed processes"]

    stuck = make(recovery_deadline_s=10.0)
    stuck.exit(1)
    stuck.clock.now += 8.0  # most of the deadline passed before the restart
    stuck.restart()
    for _ in range(19):
        stuck.step(0.5)  # the deadline starts afresh: members may have been stuck meanwhile
    assert stuck.events("escalation") == []
    stuck.step(1.0)
    escalations = stuck.events("escalation")
    assert escalations[-1]["to_action"] == "restart from checkpoint" and escalations[-1]["carried"]
    assert stuck.c.store.get_task("lm").state is TaskState.RESTARTING
    # The restored incident knew the tier it was under (restart failed processes), so it
    # escalated from there, as it would have without the restart.
    assert escalations[0]["from_action"] == "restart failed processes"
    stuck.restart()
    (reopened,) = stuck.c.recovery.incidents.values()
    assert reopened.labels() == ["restart failed processes", "restart from checkpoint"]


def test_faults_injected_before_a_restart_stay_claimed_in_the_re_created_store(make: Any) -> None:
    """A generation-0 fault strikes once: its claim lives in the task's store, which a restarted
    coordinator re-creates; the faults already injected are claimed there again."""
    from datetime import timedelta

    import torch.distributed as dist

    cluster = make()
    node, _ = cluster.running[("lm", 1, 0)]
    now = cluster.clock.now
    injected = FaultReport(task="lm", generation=1, rank=0, step=2, action="raise", time=now, index=1)
    cluster.beat(node, injected)
    cluster.restart()
    port = cluster.c.store.get_task("lm").store_port
    client = dist.TCPStore(  # type: ignore[attr-defined]
        cluster.c.act.rendezvous.host_address, port, is_master=False, timeout=timedelta(seconds=10)
    )
    # A worker claims as ``TaskStore.claim`` does: its name is stored if none is there yet.
    assert client.compare_set(fault_claim_key("lm", 1), "", "w") != b"w"  # claimed before: not w's
    assert client.compare_set(fault_claim_key("lm", 0), "", "w") == b"w"  # never injected: still free


def test_a_stalled_coordinator_loses_no_node_and_finds_no_hang(make: Any) -> None:
    """Its process did not run for 20 s (a SIGSTOP, a long pause): at its next tick every node
    looks silent and the task's last step long past, although the agents and workers went on,
    only unheard. It gives every node a full deadline to be heard from again, judges no step late
    until then, and records the stall; the same silence while it ran loses the nodes."""
    cluster = make(heartbeat_deadline_s=2.0)
    cluster.c.loop_clock, cluster.c.last_tick = cluster.clock, None  # the fake clock times the loop too
    for step in range(2, 12):  # steps every 0.5 s: the hang deadline is its floor
        cluster.train(step)
        cluster.step(0.5)
    cluster.clock.now += 20.0  # nothing ran: no tick, no heartbeat read
    cluster.c.tick()
    for step in range(12, 16):  # the agents are heard again (with what the workers did meanwhile)
        cluster.train(step)
        cluster.step(0.5)
    nodes = {n.name: n.state for n in cluster.c.store.nodes()}
    assert nodes == {"n0": NodeState.HEALTHY, "n1": NodeState.HEALTHY}
    assert cluster.events("incident") == [] and cluster.events("hang_detected") == []
    (stall,) = cluster.events("coordinator_stalled")
    assert stall["seconds"] == 20.0
    for _ in range(5):  # now silence while it runs: n1 is lost after the deadline
        cluster.clock.now += 0.5
        cluster.beat("n0")
        cluster.c.tick()
    assert cluster.c.store.node("n1").state is NodeState.LOST  # type: ignore[union-attr]


def test_an_ended_tasks_counts_left_by_a_stop_before_its_release_are_dropped_not_restored(make: Any) -> None:
    """A coordinator that stopped between a task's end and its release left the task's ladder
    counts and signs kept: a successor drops them rather than restoring them (a name submitted
    again is another task, which must not inherit its counts)."""
    cluster = make()
    cluster.exit(1)  # counted by the ladder, its signs noted
    cluster.step()
    assert cluster.c.cancel("lm")  # ended and released: its records dropped
    assert cluster.c.store.kept_record(TaskLadder, of="lm") is None
    cluster.c.act.keep(TaskLadder(failures=[cluster.clock.now]), of="lm")  # as if left by a stop
    cluster.c.act.keep(FaultSigns(recent=[(cluster.clock.now, ErrorKind.CUDA_ERROR, "n1", 1)]), of="lm")
    cluster.restart()
    assert cluster.c.store.kept_record(TaskLadder, of="lm") is None
    assert cluster.c.store.kept_record(FaultSigns, of="lm") is None
    assert "lm" not in cluster.c.recovery.ladder.failures and "lm" not in cluster.c.signs.recent


def test_a_restarted_coordinator_keeps_the_ladder_the_measured_rates_and_the_spares(make: Any) -> None:
    """What decides behaviour survives a restart: the failures the ladder counted toward the next
    escalation, the throughput measured at each size (the plan's input), the hot spares waiting,
    the recent fault signs and the step times."""
    cluster = make(hot_spares=1, run_extra=", flops_per_sample: 1.0e7")
    for step in range(2, 40):  # a full measurement window at 4 workers
        cluster.clock.now += 1.0
        cluster.train(step)
    cluster.exit(3)  # counted by the ladder
    for _ in range(3):
        cluster.step()
    cluster.c.placer._launch_spare("lm", "n1", cluster.clock.now)  # as keep_spares does on an idle slot
    cluster.clock.now += 10.0
    cluster.step()  # the step times are kept every 10 s
    before = cluster.c
    assert before.rates.used["lm"] and before.recovery.ladder.failures["lm"]
    assert before.placer.spares
    assert before.signs.recent["lm"] and len(before.detector.step_times()["lm"]) >= 10
    cluster.restart()
    assert cluster.c.rates.used == before.rates.used
    assert cluster.c.recovery.ladder == before.recovery.ladder
    assert cluster.c.placer.spares == before.placer.spares
    # The signs that attribute the next fault to the task or a node, and the step times that
    # judge hangs (no warm-up after a takeover).
    assert cluster.c.signs.recent == before.signs.recent
    assert cluster.c.signs.task_faults == before.signs.task_faults
    assert cluster.c.detector.step_times() == before.detector.step_times()
    assert cluster.c.detector.monitor("lm", cluster.c.store.get_task("lm").generation).mean_interval()


def test_a_restarted_coordinator_times_the_next_step_from_its_own_start(make: Any) -> None:
    """A new leader has its predecessor's step times (no warm-up) but has seen no step itself:
    it counts the next step's lateness from when it began to judge, not from time zero (which
    made every restart a hang: every rank restarted from the checkpoint). Training that has
    truly stopped is still found, one deadline after the start."""
    cluster = make()
    for step in range(2, 40):  # 19 s: the step times are kept every 10 s
        cluster.train(step)
        cluster.step(0.5)
    cluster.restart()
    cluster.step()  # the agents are heard; the workers' next step is not reported yet
    cluster.step()
    assert cluster.events("hang_detected") == [] and cluster.events("incident") == []
    for step in range(40, 46):  # training goes on under the new leader
        cluster.train(step)
        cluster.step(0.5)
    assert cluster.events("hang_detected") == []
    for _ in range(10):  # then it stops, every node still heard: a hang, timed from step 45
        cluster.step(0.5)
    (hang,) = cluster.events("hang_detected")
    assert hang["step"] == 46 and hang["waited_s"] < 10.0, hang


def test_a_restarted_coordinator_judges_no_step_late_until_the_agents_could_deliver_theirs(make: Any) -> None:
    """The workers trained on while no coordinator led, and what they did reaches a new one only
    as their agents find it (each may pause up to ``AGENT_RETRY_CAP_S`` between tries) and send
    their backlogs. Heard at once but with their step reports held up for 4 s, the ranks in the
    middle of their step (computing, no rank waiting: nobody to blame): no step is judged late
    until the agents have had that long and a heartbeat deadline more, which the start records.
    (Judged at once, the step was late after two seconds and the healthy task relaunched.)"""
    cluster = make(heartbeat_deadline_s=2.0)
    for step in range(2, 40):  # steps every 0.5 s: the hang deadline is its floor (1.5 s)
        cluster.train(step)
        cluster.step(0.5)
    cluster.restart()
    (started,) = [e for e in cluster.events("coordinator_started") if e["id"] > 1]
    assert started["hangs_judged_from"] == cluster.clock.now + AGENT_RETRY_CAP_S + 2.0
    generation = cluster.c.store.get_task("lm").generation
    for (task, gen, rank), (_, pid) in cluster.running.items():
        if task == "lm" and gen == generation:
            computing = Progress(
                pid=pid, generation=gen, step=40, phase=Phase.COMPUTE, time=cluster.clock.now
            )
            cluster.positions[(task, gen, rank)] = computing
    for _ in range(8):  # heard, the step reports on their way
        cluster.step(0.5)
    for step in range(40, 46):  # the backlogs arrive; training goes on
        cluster.train(step)
        cluster.step(0.5)
    assert cluster.events("hang_detected") == [] and cluster.events("incident") == []


def test_a_task_stopped_across_a_restart_is_found_hung_as_judging_begins(make: Any) -> None:
    """Its step is timed from the coordinator's start while judging waits (``hangs_judged_from``):
    a task whose ranks never step again is found hung at the first look after that, not a step
    deadline later; and a stall meanwhile does not bring judging forward."""
    cluster = make(heartbeat_deadline_s=2.0)
    cluster.c.loop_clock = cluster.clock  # the fake clock times the loop too (a stall below)
    for step in range(2, 40):
        cluster.train(step)
        cluster.step(0.5)
    cluster.restart()
    cluster.c.loop_clock = cluster.clock
    (started,) = [e for e in cluster.events("coordinator_started") if e["id"] > 1]
    begins = started["hangs_judged_from"]
    cluster.step(0.5)
    cluster.clock.now += 1.5  # the loop stalls: its grace (a deadline from now) ends before the start's
    cluster.step(0.5)
    while not cluster.events("hang_detected") and cluster.clock.now < begins + 5.0:
        assert cluster.clock.now < begins, cluster.events("hang_detected")
        cluster.step(0.5)
    (hang,) = cluster.events("hang_detected")
    assert hang["culprits"] == [], hang  # (no rank reports where it is)
    assert begins <= cluster.clock.now < begins + 0.5 + 0.5, (cluster.clock.now, begins)
    assert cluster.events("coordinator_stalled")


def test_a_restored_ladder_escalates_as_the_original_would() -> None:
    settings = Settings(max_reattempts=2)
    original = Ladder(settings)
    for at in (1.0, 2.0):
        decision = original.decide("t", ErrorKind.OTHER_NETWORK_ERROR, "n1", at)
        assert decision.tier is Tier.REATTEMPT
        original.count(decision.counted)
        original.carried("t", Tier.REATTEMPT, at)
    original.count(Counted("u", ErrorKind.CUDA_ERROR, 2.5, "n1", same=False))  # another task's, on n1
    # As kept: a record of each task and each node whose counts changed, through JSON.
    tasks, nodes = original.changed()
    assert (tasks, nodes) == (["t", "u"], ["n1"]) and original.changed() == ([], [])
    kept_tasks = {
        t: TaskLadder.model_validate_json(r.model_dump_json())
        for t in tasks
        if (r := original.task_record(t))
    }
    kept_nodes = {
        n: NodeErrors.model_validate_json(r.model_dump_json())
        for n in nodes
        if (r := original.node_record(n))
    }
    copy = Ladder(settings)
    copy.restore(kept_tasks, kept_nodes)
    assert copy == original  # (its counts; which changed since kept, not compared)
    assert copy.decide("t", ErrorKind.OTHER_NETWORK_ERROR, "n1", 3.0) == original.decide(
        "t", ErrorKind.OTHER_NETWORK_ERROR, "n1", 3.0
    )
    assert copy.decide("t", ErrorKind.OTHER_NETWORK_ERROR, "n1", 4.0).tier is Tier.RESTART_FAILED
    # A record shares the ladder's lists: the counts after it (more, or a task's cleared) leave
    # it as it was when taken.
    record = original.task_record("t")
    assert record is not None
    as_taken = record.model_dump_json()
    decision = original.decide("t", ErrorKind.OTHER_NETWORK_ERROR, "n1", 3.0)
    original.count(decision.counted)
    original.carried("t", decision.tier, 3.0)
    assert original.changed() == (["t"], [])  # (a SEV3 kind: no node blamed)
    assert original.task_record("t") != record and record.model_dump_json() == as_taken
    original.forget("t")
    assert record.model_dump_json() == as_taken
    assert original.changed() == (["t"], []) and original.task_record("t") is None  # (its record dropped)


def test_a_member_that_missed_a_grow_before_a_restart_follows_it_and_may_commit(make: Any) -> None:
    """The coordinator grows a task and is killed before its members read the new membership at
    their step boundary. Started over, it posts that membership in the re-created store again:
    a member of the old generation still finds its way to the current one, and its checkpoints
    still commit (the soak once saw it refused as superseded: the final state was never saved)."""
    from unicron.core.kept import Posted
    from unicron.train.fencing import Standing, read_standing

    cluster = make()
    cluster.regrow(2)  # recovered in place on three (generation 2), grown back to four (3)
    cluster.restart()
    rendezvous = cluster.c.act.rendezvous
    address = f"{rendezvous.host_address}:{cluster.c.store.get_task('lm').store_port}"
    # Rank 0 of the launch, carried by both changes; rank 3 failed in the first.
    assert read_standing(address, "lm", rendezvous.key("lm"), 1, 0, 5.0) is Standing.CURRENT
    assert read_standing(address, "lm", rendezvous.key("lm"), 1, 3, 5.0) is Standing.SUPERSEDED
    cluster.c.cancel("lm")
    assert cluster.c.store.kept_record(Posted, of="lm") is None  # nothing of it stays


def test_a_spare_told_to_join_before_a_restart_finds_its_identity_in_the_re_created_store(make: Any) -> None:
    """A grow takes a hot spare and the coordinator is killed before the spare read the identity
    posted for it. Started over, the coordinator posts it again in the re-created store: the
    spare, waiting there as it does (``TaskStore.wait_to_be_used``), becomes the newcomer."""
    from datetime import timedelta

    from unicron.train.taskstore import TaskStore

    cluster = make(hot_spares=1)
    cluster.exit(3)
    cluster.c.placer._launch_spare("lm", "n1", cluster.clock.now)  # in the slot lm grows into
    cluster.step()
    cluster.train(2)
    for _ in range(3):
        cluster.step()
    (growth,) = cluster.events("task_grow")
    assert growth["spares_used"] == [1000]
    cluster.restart()
    rendezvous = cluster.c.act.rendezvous
    address = f"{rendezvous.host_address}:{cluster.c.store.get_task('lm').store_port}"
    spare = TaskStore(address, "lm", rendezvous.key("lm"), timedelta(seconds=5), reconnect_s=1.0)
    waited_until = time.monotonic() + 10.0
    identity = spare.wait_to_be_used(1000, stop=lambda: time.monotonic() > waited_until, gone_for_s=5.0)
    assert identity == {"generation": growth["generation"], "rank": 3, "world_size": 4}


def grow_in_flight(cluster: Any) -> Any:
    """Rank 3 dies, the task recovers in place on three and trains, and the plan grows it back:
    the grow's newcomers are launched and have not joined. Returns the growth."""
    cluster.exit(3)
    cluster.train(2)
    for _ in range(3):
        cluster.step()
    (growth,) = cluster.c.generations.growing.values()
    return growth


def test_a_grow_in_flight_across_a_restart_goes_on_and_its_newcomers_join(make: Any) -> None:
    """The coordinator launches a grow's newcomers and is killed before they are ready. Its
    successor knows the grow (kept in the store), leaves the newcomers running, and lets them
    in once they announce themselves in the re-created store."""
    cluster = make()
    growth = grow_in_flight(cluster)
    newcomers = {("lm", growth.generation, r) for r in growth.newcomers}
    assert newcomers <= set(cluster.running)
    cluster.restart()
    assert cluster.c.generations.growing == {"lm": growth}
    cluster.step()
    assert newcomers <= set(cluster.running)  # not stopped as orphans
    for rank in growth.newcomers:
        cluster.c.act.rendezvous.set("lm", ready_key("lm", growth.generation, rank), "ready")
    cluster.step()
    assert cluster.c.store.get_task("lm").generation == growth.generation
    assert cluster.events("task_grown")[-1]["generation"] == growth.generation
    assert cluster.c.store.kept_record(InFlight) == InFlight()  # nothing under way any more


def test_a_grow_whose_newcomers_never_come_after_a_restart_is_given_up_with_its_reason(make: Any) -> None:
    cluster = make()
    growth = grow_in_flight(cluster)
    cluster.restart()
    cluster.clock.now = growth.since + cluster.settings.limits.launch_timeout_s + 1.0
    cluster.step()
    (failed,) = cluster.events("task_grow_failed")
    assert failed["generation"] == growth.generation and "not ready in time" in failed["why"]
    assert not any(g == growth.generation for (_, g, _) in cluster.running)  # exactly they stopped
    assert cluster.c.store.get_task("lm").generation < growth.generation


def test_a_storage_incident_open_across_a_restart_is_closed_by_the_successor(make: Any) -> None:
    """The persistent tier refuses checkpoints and the coordinator restarts: its successor holds
    the storage incident open (kept, not read back from the event log) and closes it, naming
    it, when rank 0's next checkpoint is persisted."""
    cluster = make()
    at = cluster.clock.now
    refused = StorageReport(task="lm", generation=1, rank=0, step=1, tier="persistent", ok=False, time=at)
    cluster.beat("n0", refused)
    (incident,) = cluster.events("incident")
    cluster.restart()
    assert cluster.c.storage.open == {("lm", "persistent"): Opened(incident["id"], at)}
    cluster.clock.now += 30.0
    cluster.beat("n0", CheckpointReport(task="lm", generation=1, rank=0, step=5, path="/ckpt/5"))
    (outcome,) = cluster.events("outcome")
    assert outcome["incident"] == incident["id"] and outcome["resumed_step"] == 5
    assert outcome["unpersisted_s"] == 30.0
    assert cluster.c.store.kept_record(StorageIncidents) == StorageIncidents()


def test_a_newcomer_that_exits_gives_its_grow_up_at_once(make: Any) -> None:
    """A newcomer dies before joining (in a real restart: its connection to the old store
    broke): the grow is given up at once, saying why, and the members train on undisturbed."""
    cluster = make()
    growth = grow_in_flight(cluster)
    cluster.restart()
    rank = growth.newcomers[0]
    node, _ = cluster.running.pop(("lm", growth.generation, rank))
    died = ExitReport(
        task="lm",
        generation=growth.generation,
        rank=rank,
        node=node,
        code=1,
        signal=None,
        time=cluster.clock.now,
    )
    cluster.beat(node, died)
    (failed,) = cluster.events("task_grow_failed")
    assert failed["why"] == f"newcomer rank {rank} on {node} exited (code 1)"
    assert not cluster.c.generations.growing
    assert len(cluster.events("incident")) == 1  # rank 3's: the newcomer's exit opens none
    assert cluster.c.store.get_task("lm").state is TaskState.RUNNING


def restart_with_the_store_port_taken(cluster: Any) -> int:
    """The coordinator is killed, and another process holds task lm's store port while it starts
    again; returns that (kept) port."""
    import socket

    from unicron.control.coordinator import Coordinator

    kept: int = cluster.c.store.get_task("lm").store_port
    host = cluster.c.act.rendezvous.host_address
    cluster.c.shutdown()
    with socket.socket() as holder:
        holder.bind((host, kept))
        holder.listen()
        cluster.c = Coordinator(cluster.settings, cluster.clock)
    return kept


def test_a_task_whose_store_port_is_taken_at_a_restart_is_told_the_new_one_and_goes_on(make: Any) -> None:
    """The coordinator is killed and, before it starts again, another process takes its task's
    store port: the store is served on another port. The nodes of the task's workers are told
    (their agents write it where the workers look), nothing is stopped or relaunched, no failure
    is counted, and a worker launched later is given the new port."""
    cluster = make()
    kept = restart_with_the_store_port_taken(cluster)
    (moved,) = cluster.events("task_store_moved")
    task = cluster.c.store.get_task("lm")
    assert (moved["kept_port"], moved["port"], moved["told"]) == (kept, task.store_port, ["n0", "n1"])
    assert task.store_port != kept and task.state is TaskState.RUNNING and task.failures == 0
    cluster.step()
    address = f"{cluster.c.act.rendezvous.host_address}:{task.store_port}"
    told = {(n, o.moved_from, o.address) for n, o in cluster.orders if isinstance(o, StoreMoved)}
    assert told == {("n0", kept, address), ("n1", kept, address)}
    assert not [o for _, o in cluster.orders if isinstance(o, StopWorkers) and o.task == "lm"]
    cluster.exit(3)  # recovered in place, then grown back with a new process
    cluster.train(2)
    for _ in range(3):
        cluster.step()
    (newcomer,) = [o for _, o in cluster.launched() if o.generation > 1]
    assert newcomer.env[KEYS["store"]] == address
    assert len(cluster.events("task_launch")) == 1  # never relaunched


def test_a_recovery_in_place_whose_store_moved_at_a_restart_goes_on_in_place(make: Any) -> None:
    """The coordinator is killed while survivors recover in place, and its task's store port is
    taken before it starts again: the workers are told where the store went, and the recovery
    goes on in place; its first step closes the incident, under the tier it began with."""
    cluster = make(recovery_deadline_s=10.0)
    cluster.exit(1)  # rank 1 fails: the others recover in place
    restart_with_the_store_port_taken(cluster)
    assert cluster.events("escalation") == []
    cluster.step()
    cluster.train(2)
    (outcome,) = cluster.events("outcome")
    assert outcome["outcome"] == "recovered" and outcome["actions"] == ["restart failed processes"]
    assert cluster.c.store.get_task("lm").failures == 1  # the worker's fault; the move counts none


def test_a_moved_store_of_a_task_with_no_workers_is_said_and_nobody_told(make: Any) -> None:
    """A task with no workers (waiting to be launched again) is launched with the new port: the
    move is said, and no node is told."""
    cluster = make()
    waiting = replace(cluster.c.store.get_task("lm"), state=TaskState.WAITING)
    (said,) = store_moved(waiting, 5000, "10.0.0.1:5001", nodes=())
    assert isinstance(said, Record) and said.kind == "task_store_moved"
    assert (said.detail["kept_port"], said.detail["port"], said.detail["told"]) == (5000, 5001, [])


def test_a_restarted_coordinator_counts_a_nodes_mends_on_from_its_predecessors(make: Any) -> None:
    """A replica on a node is mended in place (a device fault undone in the step), the
    coordinator restarts, and it is mended again: the second is the limit's (``isolate_after``
    2), counted across the restart, and the node is taken out as a faulty device."""
    cluster = make()

    def mended(step: int) -> None:
        generation = cluster.c.store.get_task("lm").generation
        node, _ = cluster.running[("lm", generation, 1)]
        report = NumericalReport(
            task="lm", generation=generation, rank=1, step=step, verdict="odd_replica", outcome="repaired",
            ranks=[1], why="rank 1 holds a state unlike the 3 others'", time=cluster.clock.now, spent_s=0.01,
        )  # fmt: skip
        cluster.beat(node, report)

    node, _ = cluster.running[("lm", cluster.c.store.get_task("lm").generation, 1)]
    mended(3)
    assert cluster.c.store.node(node).state is NodeState.HEALTHY
    cluster.restart()
    cluster.clock.now += 5.0
    mended(4)
    (taken,) = [e for e in cluster.events("incident") if e["kind"] == "silent_data_corruption"]
    assert cluster.c.store.node(node).state is NodeState.ISOLATED, taken

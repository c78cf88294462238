"""The store's contract, run against both backends: SQLite (a file) and a real etcd (started here
on loopback). Each test opens the store again where it matters, to show that what was decided is
what is kept."""

from __future__ import annotations

import dataclasses
import itertools
import typing
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from harness.etcdlocal import EtcdCluster
from unicron.brain.records import NodeRecord, TaskRecord, WorkerRecord
from unicron.control.store import etcdbackend
from unicron.control.store.backend import Fenced
from unicron.control.store.journal import Journal
from unicron.control.store.location import open_backend
from unicron.control.store.store import Store
from unicron.core.errors import Conflict, NotFound
from unicron.core.kept import Posted
from unicron.core.states import IllegalTransition, NodeState, TaskState, WorkerPhase

from .etcdrun import running_etcd

Opener = Callable[[], Store]  # opens the store again at the same place


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    yield from running_etcd(tmp_path_factory.mktemp("etcd"))


_prefixes = itertools.count()


@pytest.fixture(params=["sqlite", "etcd", "sqlite, written behind", "etcd, written behind"])
def reopen(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    """Opens the store again; "written behind": with a journal (``control/store/journal.py``, the
    service's way), whose writes are durable once ``sync`` returns, which every reopening does
    first for the stores opened before (a coordinator's successor starts after it stopped)."""
    if request.param.startswith("sqlite"):
        location = str(tmp_path / "unicron.sqlite")
    else:
        location = request.getfixturevalue("etcd").url + f"/test{next(_prefixes)}"
    opened: list[Store] = []
    fenced: list[Exception] = []

    def again() -> Store:
        for store in opened:
            store.sync()
        backend = open_backend(location)
        journal = Journal(backend, on_fenced=fenced.append) if "behind" in request.param else None
        opened.append(Store(backend, journal))
        return opened[-1]

    yield again
    for store in opened:
        store.close()
    assert not fenced


def test_tasks_move_only_by_legal_transitions_and_are_kept(reopen: Opener) -> None:
    store = reopen()
    store.add_task("a", '{"x": 1}', now=10.0)
    with pytest.raises(Conflict):
        store.add_task("a", "{}", now=11.0)
    store.task_launched("a", generation=1, workers=2, port=555, now=12.0)
    with pytest.raises(IllegalTransition):
        store.task_waiting("a")  # starting -> waiting: not allowed, nothing written
    store.task_down("a", TaskState.STARTING, now=14.0, reason="lost")  # recovers in place
    assert store.task_running("a", now=16.5) == pytest.approx(2.5)
    store.task_checkpointed("a", 7)
    store.task_checkpointed("a", 5)  # never moves back
    with pytest.raises(NotFound):
        store.task_running("nope", now=1.0)
    task = reopen().get_task("a")
    assert (task.state, task.generation, task.workers, task.store_port) == (TaskState.RUNNING, 1, 2, 555)
    assert (task.failures, task.downtime_s, task.down_since, task.reason) == (1, 2.5, None, "lost")
    assert (task.checkpoint_step, task.started, task.spec) == (7, 12.0, '{"x": 1}')


def test_an_ended_tasks_name_is_taken_again_and_the_ended_one_kept(reopen: Opener) -> None:
    """A name whose task ended is submitted again: the ended one is kept as NAME#RUN, the new one
    is the name's next run, and its generations follow the earlier run's (its rows stay under the
    name: no worker identity is used twice); a live task's name is not taken."""
    store = reopen()
    store.add_task("a", '{"v": 1}', now=10.0)
    with pytest.raises(Conflict, match="cancel it first"):
        store.replace_task("a", "{}", now=11.0)
    store.task_launched("a", generation=1, workers=2, port=555, now=12.0)
    store.add_workers("a", 3, {"n0": 1}, 0, WorkerPhase.LAUNCHING, now=13.0)  # a grow's newcomer
    store.task_ended("a", TaskState.FAILED, now=14.0, reason="bad")
    assert store.replace_task("a", '{"v": 2}', now=15.0) == "a#1"
    for opened in (store, reopen()):
        kept, new = opened.get_task("a#1"), opened.get_task("a")
        assert (kept.state, kept.spec, kept.reason, kept.run) == (TaskState.FAILED, '{"v": 1}', "bad", 1)
        assert (new.state, new.spec, new.run, new.first_generation) == (TaskState.WAITING, '{"v": 2}', 2, 4)
        assert (new.generation, new.step, new.started, new.submitted) == (0, 0, None, 15.0)
        assert [t.name for t in opened.tasks()] == ["a#1", "a"]  # the new one after the one it replaced
        assert [w.generation for w in opened.workers("a")] == [3]  # the earlier run's rows stay
    store = reopen()
    store.task_launched("a", generation=4, workers=1, port=556, now=16.0)
    assert store.get_task("a").restarts == 0  # its first launch is no restart
    store.task_ended("a", TaskState.CANCELLED, now=17.0)
    assert store.replace_task("a", "{}", now=18.0) == "a#2"
    assert (store.get_task("a").run, store.get_task("a").first_generation) == (3, 5)


def test_a_step_is_counted_once_and_a_redone_step_is_not_progress(reopen: Opener) -> None:
    store = reopen()
    store.add_task("a", "{}", now=1.0)
    store.task_launched("a", 1, 1, 0, now=2.0)
    assert store.count_iteration("a", 1, 0, step=1, samples=8, flop=10.0)
    assert store.count_iteration("a", 1, 0, step=2, samples=8, flop=10.0)
    assert not store.count_iteration("a", 1, 0, step=2, samples=8, flop=10.0)  # sent again
    store.task_down("a", TaskState.RESTARTING, now=3.0)
    store.task_waiting("a")
    store.task_launched("a", 2, 1, 0, now=4.0)  # from a checkpoint at step 0: steps 1-2 are redone
    reopened = reopen()
    assert not reopened.count_iteration("a", 1, 0, step=1, samples=8, flop=10.0)  # kept across a restart
    assert reopened.count_iteration("a", 2, 0, step=2, samples=8, flop=10.0)
    assert reopened.count_iteration("a", 2, 0, step=3, samples=8, flop=10.0)
    task = reopen().get_task("a")
    assert (task.samples, task.flop, task.step, task.redo_until, task.restarts) == (24, 30.0, 3, 2, 1)


def test_workers_take_free_local_slots_and_keep_their_first_verdict(reopen: Opener) -> None:
    store = reopen()
    store.node_registered("n1", 4, ["g0", "g1", "g2", "g3"], "10.0.0.1", NodeState.HEALTHY, now=1.0)
    store.add_task("a", "{}", 1.0)
    store.add_task("b", "{}", 2.0)
    store.add_workers("a", 0, {"n1": 1}, 0, WorkerPhase.SPARE, now=2.0)
    first = store.add_workers("b", 1, {"n1": 2}, 0, WorkerPhase.LAUNCHING, now=3.0)
    assert [w.local_rank for w in first] == [1, 2]
    assert store.worker_phase(("b", 1, 0), WorkerPhase.RUNNING, pid=42)
    assert store.worker_phase(("b", 1, 1), WorkerPhase.FAILED, code=3)
    assert not store.worker_phase(("b", 1, 1), WorkerPhase.RUNNING)  # ended: the verdict stands
    assert not store.worker_phase(("b", 9, 0), WorkerPhase.RUNNING)
    again = store.add_workers("b", 1, {"n1": 1}, 2, WorkerPhase.LAUNCHING, now=4.0)
    assert [w.local_rank for w in again] == [2]  # the failed worker's slot is free
    reopened = reopen()
    assert reopened.held_slots() == {"n1": {"b": 2}}
    assert [(w.rank, w.state, w.pid, w.exit_code) for w in reopened.workers("b", 1)] == [
        (0, WorkerPhase.RUNNING, 42, None),
        (1, WorkerPhase.FAILED, None, 3),
        (2, WorkerPhase.LAUNCHING, None, None),
    ]
    assert (reopened.max_generation("b"), reopened.max_rank("b", 1), reopened.max_rank("b", 5)) == (
        1,
        2,
        None,
    )


def test_a_generation_switches_in_one_commit_and_a_spare_takes_a_newcomers_place(reopen: Opener) -> None:
    store = reopen()
    store.node_registered("n1", 4, [], "h", NodeState.HEALTHY, now=1.0)
    store.add_task("a", "{}", 1.0)
    store.task_launched("a", 1, 3, 0, now=2.0)
    store.add_workers("a", 1, {"n1": 3}, 0, WorkerPhase.RUNNING, now=2.0)
    store.add_workers("a", 0, {"n1": 1}, 0, WorkerPhase.SPARE, now=2.0)
    survivors = store.workers("a", 1)
    store.worker_phase(survivors[1].key, WorkerPhase.FAILED, code=1)
    store.switch_generation("a", 1, 2, [(survivors[0], 0), (survivors[2], 1)], now=5.0)
    store.spare_used("a", 0, generation=2, rank=2, node="n1", local=3, now=6.0)
    snap = reopen().snapshot()
    assert snap.task("a").generation == 2 and snap.task("a").workers == 2
    assert [(w.rank, w.local_rank, w.state) for w in snap.live("a")] == [
        (0, 0, WorkerPhase.RUNNING),
        (1, 2, WorkerPhase.RUNNING),
        (2, 3, WorkerPhase.LAUNCHING),
    ]
    assert snap.next_generation["a"] == 3
    states = {w.rank: w.state for w in reopen().workers("a", 1)}
    assert states == {0: WorkerPhase.MOVED, 1: WorkerPhase.FAILED, 2: WorkerPhase.MOVED}
    assert reopen().worker("a", 0, 0).state is WorkerPhase.USED  # type: ignore[union-attr]


def test_a_grows_newcomers_are_joining_until_their_generation_trains_a_step(reopen: Opener) -> None:
    """A grow's newcomers (new processes or a spare) hold none of the task's state until the
    generation they joined trains its first step: kept across a restart and a re-forming."""
    store = reopen()
    store.node_registered("n1", 4, [], "h", NodeState.HEALTHY, now=1.0)
    store.add_task("a", "{}", 1.0)
    store.task_launched("a", 1, 1, 0, now=2.0)
    store.add_workers("a", 1, {"n1": 1}, 0, WorkerPhase.RUNNING, now=2.0)
    store.add_workers("a", 0, {"n1": 1}, 0, WorkerPhase.SPARE, now=2.0)
    store.add_workers("a", 2, {"n1": 1}, 1, WorkerPhase.LAUNCHING, now=3.0, joining=True)
    store.spare_used("a", 0, generation=2, rank=2, node="n1", local=3, now=3.0)
    (member,) = store.workers("a", 1)
    store.switch_generation("a", 1, 2, [(member, 0)], now=4.0)
    assert [(w.rank, w.joining) for w in reopen().snapshot().live("a")] == [(0, False), (1, True), (2, True)]
    newcomers = reopen().workers("a", 2)[1:]
    store.switch_generation("a", 2, 3, [(member, 0), (newcomers[0], 1)], now=5.0)  # rank 2 failed
    assert [w.joining for w in reopen().workers("a", 3)] == [False, True]
    assert store.count_iteration("a", 3, 1, step=7, samples=8, flop=1.0)  # (rank 0's step counts)
    assert [w.joining for w in reopen().workers("a", 3)] == [False, True]
    assert store.count_iteration("a", 3, 0, step=7, samples=8, flop=1.0)
    assert [w.joining for w in reopen().workers("a", 3)] == [False, False]


def test_a_lost_node_loses_its_workers_and_a_removed_node_is_gone(reopen: Opener) -> None:
    store = reopen()
    for i, name in enumerate(["n1", "n2"]):
        store.node_registered(name, 2, [], f"h{i}", NodeState.HEALTHY, now=1.0, probe_port=7000 + i)
    store.add_task("a", "{}", 1.0)
    store.add_workers("a", 1, {"n1": 1, "n2": 1}, 0, WorkerPhase.RUNNING, now=2.0)
    store.node_seen("n2", now=9.0)
    store.node_state("n1", NodeState.LOST)
    assert [w.rank for w in store.lose_node_workers("n1")] == [0]
    store.node_state("n2", NodeState.DRAINING)
    with pytest.raises(IllegalTransition):
        store.node_state("n2", NodeState.ISOLATED)  # draining -> isolated: not allowed
    store.remove_node("n1")
    reopened = reopen()
    assert [n.name for n in reopened.nodes()] == ["n2"] and reopened.node("n1") is None
    n2 = reopened.node("n2")
    assert n2 is not None and (n2.probe_port, n2.state, n2.host) == (7001, NodeState.DRAINING, "h1")
    assert [w.state for w in reopened.workers("a", 1)] == [WorkerPhase.LOST, WorkerPhase.RUNNING]
    assert reopened.live_workers_on("n2")[0].rank == 1 and reopened.live_workers_on("n1") == []
    # A drain outlasts a loss (its row keeps it, with the node's failure domain), until resumed.
    assert n2.drained
    reopened.node_state("n2", NodeState.LOST)
    reopened.node_registered("n3", 2, [], "h3", NodeState.HEALTHY, now=1.0, domain="rack-1")
    again = reopen()
    assert again.node("n2").drained and again.node("n3").domain == "rack-1"  # type: ignore[union-attr]
    again.node_registered("n2", 2, [], "h1", NodeState.DRAINING, now=2.0)
    again.node_state("n2", NodeState.HEALTHY)  # resumed
    assert not reopen().node("n2").drained  # type: ignore[union-attr]


def test_events_are_read_in_order_filtered_and_paged(reopen: Opener, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(etcdbackend, "PAGE", 3)  # several pages out of a few events
    store = reopen()
    ids = [store.event("tick", task="a" if i % 2 else "b", node="n1", i=i) for i in range(8)]
    store.event("node_lost", node="n2", seconds=3.2)
    assert ids == sorted(ids) and len(set(ids)) == 8
    reopened = reopen()
    assert [e.detail["i"] for e in reopened.events(task="a")] == [1, 3, 5, 7]
    assert [e.detail["i"] for e in reopened.events(task="a", limit=2, newest=True)] == [5, 7]
    assert [e.detail["i"] for e in reopened.events(since_id=ids[5], kinds=["tick"])] == [6, 7]
    assert reopened.events(kinds=["node_lost"])[0].detail == {"seconds": 3.2}
    assert reopened.event("later") > ids[-1]  # ids go on after a restart


def test_a_write_fenced_by_another_leader_changes_nothing(etcd: EtcdCluster) -> None:
    backend = open_backend(etcd.url + "/fenced")
    assert isinstance(backend, etcdbackend.EtcdBackend)
    store = Store(backend)
    store.add_task("a", "{}", 1.0)
    backend.clients.post(
        "kv/put", {"key": etcdbackend.encode("/fenced/leader"), "value": etcdbackend.encode("other")}
    )
    backend.fence = ("/fenced/leader", "me")
    with pytest.raises(Fenced):
        store.task_launched("a", 1, 2, 0, now=2.0)
    with pytest.raises(Fenced):
        store.event("x")
    assert store.get_task("a").state is TaskState.WAITING  # in memory too
    assert Store(open_backend(etcd.url + "/fenced")).get_task("a").state is TaskState.WAITING
    backend.fence = ("/fenced/leader", "other")
    store.task_launched("a", 1, 2, 0, now=2.0)
    assert Store(open_backend(etcd.url + "/fenced")).get_task("a").state is TaskState.STARTING


def test_a_bad_store_url_is_refused_naming_the_fix() -> None:
    from unicron.core.errors import UsageError

    with pytest.raises(UsageError, match="host:port"):
        etcdbackend.parse_url("etcd://localhost")
    assert etcdbackend.parse_url("etcd://a:1,b:2/x/") == ([("a", 1), ("b", 2)], "/x")


def test_a_standby_opened_early_continues_the_event_log_and_never_overwrites_it(etcd: EtcdCluster) -> None:
    url = etcd.url + "/early"
    standby = open_backend(url)  # made when its process starts; it leads (loads) later
    first = Store(open_backend(url))
    ids = [first.event("x") for _ in range(3)]
    assert Store(standby).event("y") == ids[-1] + 1
    with pytest.raises(FileExistsError):  # the id ``first`` would use next was taken meanwhile:
        first.event("z")  # refused, never overwritten (with leadership, the old leader is fenced first)
    assert [e.kind for e in Store(open_backend(url)).events()] == ["x", "x", "x", "y"]


def test_what_a_part_keeps_is_there_after_a_restart(reopen: Opener) -> None:
    store = reopen()
    assert store.kept("ladder") is None
    store.keep("ladder", {"failures": {"a": [1.5, 2.5]}})
    store.keep("rates", {"a": {"4": 3.5e9}})
    store.keep("ladder", {"failures": {}})  # replaced, not merged
    store.keep_record(Posted(keys={"k": "v"}), of="a")  # one record per task
    store.keep_record(Posted(keys={"k": "w"}), of="b")
    store.drop_record(Posted, of="b")  # its task ended
    reopened = reopen()
    assert reopened.kept("ladder") == {"failures": {}} and reopened.kept("rates") == {"a": {"4": 3.5e9}}
    assert reopened.kept_record(Posted, of="a") == Posted(keys={"k": "v"})
    assert reopened.kept_record(Posted, of="b") is None and reopened.kept_record(Posted) is None


def test_one_coordinator_leads_a_standby_takes_over_when_it_stops_and_the_old_one_is_fenced(
    etcd: EtcdCluster,
) -> None:
    from unicron.control.store.leadership import Leader, Leadership, lost

    first_backend = open_backend(etcd.url + "/elect")
    second_backend = open_backend(etcd.url + "/elect")
    assert isinstance(first_backend, etcdbackend.EtcdBackend)
    assert isinstance(second_backend, etcdbackend.EtcdBackend)
    first = Leadership(first_backend, Leader("c1", "http://a:1"), ttl_s=2)
    second = Leadership(second_backend, Leader("c2", "http://b:1"), ttl_s=2)
    assert first.campaign()
    tries = iter(range(3))
    assert not second.campaign(poll_s=0.05, stop=lambda: next(tries, None) is None)  # c1 leads
    assert second.leader() == Leader("c1", "http://a:1") and first.renew()
    first_store = Store(first_backend)
    first_store.add_task("a", "{}", 1.0)
    # c1 stops renewing (a stall, a partition): its lease runs out and c2 takes the key.
    assert second.campaign(poll_s=0.1)
    assert second.leader() == Leader("c2", "http://b:1") and not first.renew()
    with pytest.raises(Fenced):
        first_store.add_task("b", "{}", 2.0)
    assert Store(second_backend).task("b") is None and Store(second_backend).task("a") is not None
    second.resign()
    assert second.leader() is None
    assert not lost(10.0, 11.0, ttl_s=3.0) and lost(10.0, 12.5, ttl_s=3.0)


def test_a_client_given_several_coordinators_moves_on_and_backs_off_after_a_round() -> None:
    from unicron.core.coordinators import Coordinators
    from unicron.core.errors import UsageError

    many = Coordinators.of("http://a:1, http://b:2/")
    assert many.current == "http://a:1"
    assert not many.failed() and many.current == "http://b:2"  # next at once
    assert many.failed() and many.current == "http://a:1"  # a whole round failed: back off
    many.failed()
    many.answered()
    assert not many.failed()  # counting starts again once one answered
    with pytest.raises(UsageError, match="http"):
        Coordinators.of("a:1")


def test_a_records_state_is_its_one_field_that_a_row_turns_into_a_plain_value() -> None:
    """``records.row`` turns only ``state`` into its value: every other field of every record kept
    as a row is a plain value (a new enum field would be stored as the enum, not its value)."""
    plain = (str, int, float, bool, type(None))
    for kind in (TaskRecord, NodeRecord, WorkerRecord):
        hints = typing.get_type_hints(kind)
        types = {f.name: typing.get_args(hints[f.name]) or (hints[f.name],) for f in dataclasses.fields(kind)}
        enums = [name for name, union in types.items() if not all(t in plain for t in union)]
        assert enums == ["state"], (kind.__name__, enums)


def test_a_worker_made_from_another_equals_replaces_and_stays_frozen() -> None:
    """``WorkerRecord.in_state``, ``in_generation`` and ``as_rank`` copy the record's fields
    without the dataclass's set-up: equal to ``replace``'s (so a field added to the record is
    kept), as hashable, as frozen, the original unchanged."""
    values = {f.name: f"v{i}" for i, f in enumerate(dataclasses.fields(WorkerRecord))}
    worker = WorkerRecord(**{**values, "state": WorkerPhase.LOST})
    running = {"state": WorkerPhase.RUNNING, "exit_code": None, "exit_signal": None}
    moved = dataclasses.replace(worker, generation=4, rank=7, launched=9.0, **running)
    for made, expected in (
        (worker.in_state(WorkerPhase.MOVED), dataclasses.replace(worker, state=WorkerPhase.MOVED)),
        (worker.in_generation(4, 7, 9.0), moved),
        (worker.as_rank(5, 1), dataclasses.replace(worker, rank=5, local_rank=1)),
    ):
        assert made == expected != worker and hash(made) == hash(expected)
        with pytest.raises(dataclasses.FrozenInstanceError):
            made.rank = 8  # type: ignore[misc]
    assert worker == WorkerRecord(**{**values, "state": WorkerPhase.LOST})


def test_the_healthy_names_are_found_again_only_when_a_node_changes_state(reopen: Opener) -> None:
    """Deciders ask a snapshot for the healthy nodes many times a decision; the store finds them
    once between node state changes (at 2,048 nodes, a tenth of a crash's decision), and the copy
    recovery reads (with its isolations) keeps them."""
    store = reopen()
    for i, name in enumerate(["n1", "n2"]):
        store.node_registered(name, 2, [], f"h{i}", NodeState.HEALTHY, now=1.0, probe_port=7000 + i)
    first = store.snapshot()
    assert first.healthy() == {"n1", "n2"}
    store.node_registered("n1", 2, [], "h0", NodeState.HEALTHY, now=2.0, probe_port=7000)  # again, as it was
    store.node_seen("n2", now=3.0)
    assert store.snapshot().healthy() is first.healthy()  # not found again
    copy = first.with_isolations({"n2": 9.0})
    assert copy.isolated_until == {"n2": 9.0} and copy.healthy_names is first.healthy_names
    changes = store.node_changes
    store.node_state("n1", NodeState.LOST)
    assert store.snapshot().healthy() == {"n2"} and store.node_changes == changes + 1
    store.node_registered("n2", 2, [], "h1", NodeState.HEALTHY, now=4.0, probe_port=7001, domain="rack")
    assert store.node_changes == changes + 2  # a domain named: the sweep reads the nodes again


def test_a_snapshot_reads_again_only_the_tasks_whose_rows_changed(reopen: Opener) -> None:
    """A heartbeat makes the next whole snapshot new; each task's members in it are read again
    only if the task's rows changed or it moved to another generation (at 2,048 nodes, sorting
    every task's members again was most of a node loss's tick)."""
    store = reopen()
    store.node_registered("n1", 4, [], "h", NodeState.HEALTHY, now=1.0)
    for name in ("a", "b"):
        store.add_task(name, "{}", 1.0)
        store.add_workers(name, 1, {"n1": 2}, 0, WorkerPhase.RUNNING, now=2.0)
        store.task_membership(name, 1, 2)
    first = store.snapshot()
    store.node_seen("n1", now=3.0)
    second = store.snapshot()
    assert second is not first and second.live("a") is first.live("a") and second.live("b") is first.live("b")
    store.worker_phase(("a", 1, 1), WorkerPhase.FAILED, code=1)
    third = store.snapshot()
    assert [w.rank for w in third.live("a")] == [0] and third.live("b") is first.live("b")
    store.switch_generation("a", 1, 2, [(third.live("a")[0], 0)], now=4.0)
    fourth = store.snapshot()
    assert [(w.generation, w.rank) for w in fourth.live("a")] == [(2, 0)]
    assert fourth.next_generation == {"a": 3, "b": 2} and fourth.live("b") is first.live("b")


def test_a_snapshot_counts_each_tasks_members_on_each_node_as_it_reads_them(reopen: Opener) -> None:
    """A snapshot says how many of a task's members are on each node (the planner's view reads
    it for every task), the same mapping until one of the task's rows changes; a snapshot built
    by hand counts them when asked."""
    store = reopen()
    for node in ("n1", "n2"):
        store.node_registered(node, 4, [], "h", NodeState.HEALTHY, now=1.0)
    for name in ("a", "b"):
        store.add_task(name, "{}", 1.0)
        store.add_workers(name, 1, {"n1": 2, "n2": 1}, 0, WorkerPhase.RUNNING, now=2.0)
        store.task_membership(name, 1, 3)
    first = store.snapshot()
    assert first.spread("a") == {"n1": 2, "n2": 1} == first.spread("b")
    store.worker_phase(("a", 1, 0), WorkerPhase.FAILED, code=1)
    second = store.snapshot()
    assert second.spread("a") == {"n1": 1, "n2": 1} and second.spread("b") is first.spread("b")
    by_hand = dataclasses.replace(second, spreads={})
    assert by_hand.spread("a") == second.spread("a") and by_hand.spread("gone") == {}
    fewer = dataclasses.replace(second, members={**second.members, "b": second.live("b")[:1]})
    assert fewer.spread("b") == {"n1": 1} and fewer.spread("a") is second.spread("a")


def test_a_generations_rows_are_sorted_again_only_after_one_of_them_changes(reopen: Opener) -> None:
    """``workers(task, generation)`` keeps each generation's rows by rank (all, and the live
    ones) until a row of that generation changes: a tick's checks read them for every task."""
    store = reopen()
    store.node_registered("n1", 4, [], "h", NodeState.HEALTHY, now=1.0)
    store.add_task("a", "{}", 1.0)
    store.add_workers("a", 1, {"n1": 3}, 0, WorkerPhase.RUNNING, now=2.0)
    store.add_workers("a", 2, {"n1": 1}, 0, WorkerPhase.LAUNCHING, now=2.0)
    first = store.workers("a", 1)
    assert [w.rank for w in first] == [0, 1, 2] and first == store.workers("a", 1, live=True)
    first.clear()  # (a copy: the kept one is not the caller's)
    assert len(store.workers("a", 1)) == 3
    store.worker_phase(("a", 2, 0), WorkerPhase.RUNNING)  # another generation's row
    assert [w.rank for w in store.workers("a", 1, live=True)] == [0, 1, 2]
    store.worker_phase(("a", 1, 1), WorkerPhase.FAILED, code=1)
    assert [w.rank for w in store.workers("a", 1, live=True)] == [0, 2]
    assert [(w.rank, w.state) for w in store.workers("a", 1)][1] == (1, WorkerPhase.FAILED)
    assert [w.state for w in reopen().workers("a", 1)] == [w.state for w in store.workers("a", 1)]


def test_a_whole_snapshot_is_read_again_only_after_a_change(reopen: Opener) -> None:
    """A plan's tick reads the whole cluster several times with nothing changed between: the
    same snapshot is given back; any change (a worker's phase, a node heard, a task moved) makes
    the next one new, and it shows the change. A snapshot of one task is always read anew."""
    store = reopen()
    store.node_registered("n1", 2, [], "h", NodeState.HEALTHY, now=1.0)
    store.add_task("a", "{}", 1.0)
    store.add_workers("a", 1, {"n1": 2}, 0, WorkerPhase.RUNNING, now=2.0)
    store.task_membership("a", 1, 2)
    first = store.snapshot()
    assert store.snapshot() is first and store.snapshot(only="a") is not store.snapshot(only="a")
    assert [w.rank for w in first.live("a")] == [0, 1]
    store.worker_phase(("a", 1, 1), WorkerPhase.FAILED, code=1)
    second = store.snapshot()
    assert second is not first and [w.rank for w in second.live("a")] == [0]
    assert [w.rank for w in first.live("a")] == [0, 1]  # (what was read stays as it was read)
    store.node_seen("n1", now=5.0)
    assert store.snapshot() is not second and store.snapshot().nodes["n1"].last_seen == 5.0

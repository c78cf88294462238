"""Which task a hot spare is for, where it goes, and which spares make room for the plan (pure
logic, and the coordinator stepped by hand; the live test is test_live_spares)."""

from __future__ import annotations

from typing import Any

from unicron.control.place.spares import choose, in_the_way, seated, spare_gains
from unicron.core.gpus import custom_gpu
from unicron.core.livespecs import LiveTaskSpec
from unicron.planning.throughput import curve_for


def spec(name: str, weight: float, table: dict[int, float], recovery: str = "in_process") -> LiveTaskSpec:
    return LiveTaskSpec.model_validate(
        {
            "name": name,
            "weight": weight,
            "throughput": table,
            "run": {"program": ["python", "x.py"], "iterations": 10, "recovery": recovery},
        }
    )


def test_the_task_that_loses_most_while_shrunk_gets_the_spare() -> None:
    specs = [
        spec("heavy", 3, {2: 2.0e9, 3: 2.9e9}),  # shrinks 3 -> 2: loses 3 x 0.9e9
        spec("light", 1, {2: 2.0e9, 4: 3.8e9}),  # shrinks 4 -> 2: loses 1 x 1.8e9
        spec("rigid", 9, {4: 4.0e9}),  # cannot shrink in place: a spare does not help it
        spec("restarts", 9, {2: 2.0e9, 3: 3.0e9}, recovery="restart"),
    ]
    gpu = custom_gpu(1e12)
    curves = {s.name: curve_for(s, gpu, 2) for s in specs}
    workers = {"heavy": 3, "light": 4, "rigid": 4, "restarts": 3}
    gains = spare_gains(specs, workers, curves)
    assert [name for _, name in gains] == ["heavy", "light"]
    # One idle slot: the heavy task's, on a node it runs on when there is one.
    assert choose({"a": 1, "b": 1}, gains, {}, {"heavy": {"b"}}, per_task=1)[0] == ("heavy", "b")
    assert choose({"a": 1}, gains, {"heavy": 1}, {}, per_task=1) == [("light", "a")]
    assert choose({"a": 0}, gains, {}, {}, per_task=1) == []


def test_a_spare_in_a_seat_its_own_task_grows_into_stays_and_others_make_room() -> None:
    # Node a: 2 slots, the plan puts 2 workers there, one of them a newcomer of "lm".
    waiting = [("other", "a"), ("lm", "a"), ("lm", "a"), ("lm", "b")]
    sits = seated(waiting, {("lm", "a"): 1})
    assert sits == [False, True, False, False]  # one seat: the first spare of lm there fills it
    # On a the plan's 2 workers (the seated spare among them) leave no room for the other two;
    # on b the plan leaves one slot idle: its spare stays.
    assert in_the_way(waiting, sits, {"a": 2, "b": 1}, slots=2) == [0, 2]
    assert in_the_way(waiting, [False] * 4, {"a": 2, "b": 1}, slots=2) == [0, 1, 2]  # without seats


def test_the_grow_back_takes_the_spare_in_the_slot_it_grows_into(make: Any) -> None:
    """Rank 3 fails; a spare of the task is started in its freed slot (where the plan will grow
    the task back) while the survivors recover in place. The grow takes the spare, renamed to
    the newcomer's identity, instead of stopping it to start a new process in its slot."""
    from unicron.core.protocol import LaunchWorker, RenameWorkers

    cluster = make(hot_spares=1)
    cluster.exit(3)
    cluster.c.placer._launch_spare("lm", "n1", cluster.clock.now)  # as keep_spares may
    cluster.step()  # the survivors re-form; the plan wants the slot for lm's grow
    cluster.train(2)
    for _ in range(3):
        cluster.step()
    (growth,) = cluster.events("task_grow")
    assert growth["spares_used"] == [1000] and growth["new_processes"] == {}
    assert growth["placement"] == {"n1": 1}  # where the newcomer is: the spare, there
    renamed = [o for _, o in cluster.orders if isinstance(o, RenameWorkers) and 1000 in o.ranks]
    assert [(o.new_generation, o.ranks) for o in renamed] == [(growth["generation"], {1000: 3})]
    launched = [o for _, o in cluster.orders if isinstance(o, LaunchWorker)]
    assert len(launched) == 5  # the first generation's four and the spare: no new process


def test_a_tasks_spare_is_stopped_as_the_task_ends(make: Any) -> None:
    """The task's end stops its waiting spare at once, with the end on record: not at the next
    plan (a reader of the events right after the end, as the live test is, saw no stop)."""
    from unicron.core.protocol import StopWorkers
    from unicron.core.states import TaskState

    cluster = make(hot_spares=1)
    cluster.c.placer._launch_spare("lm", "n1", cluster.clock.now)  # as keep_spares may
    cluster.finish()  # no tick after it
    assert cluster.c.store.get_task("lm").state is TaskState.FINISHED
    kinds = [e.kind for e in cluster.c.store.events(task="lm")]
    assert kinds[-2:] == ["task_finished", "spare_stopped"], kinds
    stops = [o for n, o in cluster.orders if isinstance(o, StopWorkers) and n == "n1" and o.generation == 0]
    assert [o.rank for o in stops] == [1000]
    assert cluster.c.placer.spare_list() == []

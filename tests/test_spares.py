"""Which task a hot spare is for, and where it goes (pure logic; the live test is test_live_spares)."""

from __future__ import annotations

from unicron.control.spares import choose, spare_gains
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

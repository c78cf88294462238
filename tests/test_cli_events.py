"""`unicron events` as a person reads it: local times, plain details (no epoch floats, no Python
reprs, one line each), and a task's events with the plans that changed it."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from unicron.cli.live import event_cells, losses_held, plain


def test_an_events_time_and_details_read_plainly() -> None:
    at = datetime(2026, 11, 29, 14, 3, 7, 250_000).timestamp()
    event = {
        "id": 7,
        "time": at,
        "kind": "incident",
        "task": "lm",
        "node": "n1",
        "detail": {
            "detected_at": at,
            "detection_s": 0.123456,
            "failed": [3],
            "changes": {"lm": [4, 3]},
            "escalated": False,
            "formed": None,
            "log_tail": "Traceback (most recent call last):\n  File 'train.py'\nValueError: bad\n",
        },
    }
    ident, time, kind, task, node, detail = event_cells(event)
    assert (ident, time, kind, task, node) == ("7", "2026-11-29 14:03:07.250", "incident", "lm", "n1")
    assert detail.plain == (
        "detected_at=14:03:07.250, detection_s=0.123, failed=[3], changes={lm: [4, 3]}, escalated=no, "
        "formed=-, log_tail=Traceback (most recent call last): | File 'train.py' | ValueError: bad"
    )
    assert plain("x" * 1000).endswith("...") and len(plain("x" * 1000)) == 300
    assert plain(3.0e9) == "3e+09" and plain(2.50) == "2.5"


def test_a_tasks_events_include_the_plans_that_changed_it(make: Any) -> None:
    cluster = make()
    mine = cluster.c.store.events(task="lm")
    plans = [e for e in mine if e.kind == "plan"]
    assert plans and all("lm" in e.detail["changes"] for e in plans)
    assert [e.id for e in mine] == sorted(e.id for e in mine)
    assert not [e for e in cluster.c.store.events(task="other") if e.kind == "plan"]


class Losses:
    """The API's answer to GET /v1/node-losses, played (``losses_held`` asks for nothing else)."""

    def __init__(self, reason: str = "", **now: Any) -> None:
        self.answer = {"held": now.get("by_hand", False), "reason": reason, "since": 0.0, "now": now}

    def request(self, method: str, path: str) -> dict[str, Any]:
        assert (method, path) == ("GET", "/v1/node-losses")
        return self.answer


def test_unicron_status_says_when_node_losses_are_held_and_why() -> None:
    quiet = {"by_hand": False, "alarm": None, "domains": [], "nodes": 0}
    assert losses_held(Losses(**quiet)) == []  # type: ignore[arg-type]
    (line,) = losses_held(Losses(**{**quiet, "alarm": "mass silence", "nodes": 3}))  # type: ignore[arg-type]
    assert line.plain == "Node losses held: mass silence: 3 silent node(s) not declared lost"
    by_hand = Losses("switch upgrade", **{**quiet, "by_hand": True, "domains": ["rack-b"]})
    (line,) = losses_held(by_hand)  # type: ignore[arg-type]
    assert line.plain == (
        "Node losses held: by hand (switch upgrade); failure domain rack-b partly silent: no silent node yet"
    )

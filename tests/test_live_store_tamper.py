"""An intruder on the task network, through real processes: it reaches a task's rendezvous
store (a TCPStore, which has no authentication) and, while the task trains, deletes the values
the coordinator posted there, replays an old signed current generation and an old membership
under its own name, and floods the store with writes to unrelated keys. Signing stops forgeries;
this is about the rest. The task must finish exact and on time: no checkpoint refused, no
restart, no incident but the one the test injects (which moves the task to a new generation, so
that there is an old one to replay), every step trained on its global batch once. The attack
comes in rounds a little slower than the coordinator puts values back (once a second): one that
deletes faster holds commits back (asked again, never refused), as one who cuts the workers'
connections holds training back (docs/security.md).
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import torch.distributed as dist

from bench.leftovers import listening_ports
from unicron.control.launch.localcluster import LocalCluster
from unicron.core.protocol import current_key, membership_key

from .test_live_cluster import (
    assert_ends_exact,
    assert_ledger_exact,
    finish_and_settle,
    full_speed,
    pace,
    story_of,
    traced_task,
)

ITERATIONS = 60
ROUNDS = 60  # of the attack: bounded in count ...
ATTACK_S = 120.0  # ... and in time
ROUND_S = 1.5  # one round of deletions and replays this often (the coordinator puts back each second)
FLOOD_PER_ROUND = 500  # writes to unrelated keys per round (30,000 at most)


def store_address(cluster: LocalCluster) -> str:
    """Where the task's store listens, as a scan of the coordinator's host finds it: the one port
    its coordinator listens on besides its API's (the cluster runs one task); "" before."""
    api = urlsplit(cluster.url).port
    ports = listening_ports([process.pid for process in cluster.coordinators.values()]) - {api}
    return f"127.0.0.1:{ports.pop()}" if len(ports) == 1 else ""


class Intruder:
    """Holds a raw client of the task's store and attacks it in rounds until told to stop."""

    def __init__(self, address: str) -> None:
        host, port = address.rsplit(":", 1)
        self.raw: Any = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=10))  # type: ignore[attr-defined]
        self.stop = threading.Event()
        self.rounds = 0
        self.seen: dict[str, bytes] = {}  # signed values copied while they were current

    def copied(self, key: str) -> bool:
        if key not in self.seen and self.raw.check([key]):
            self.seen[key] = self.raw.get(key)
        return key in self.seen

    def attack(self) -> None:
        old_current, old_membership = self.seen[current_key("lm")], self.seen[membership_key("lm", 1)]
        began = time.monotonic()
        while not self.stop.is_set() and self.rounds < ROUNDS and time.monotonic() - began < ATTACK_S:
            self.rounds += 1
            try:
                self.raw.delete_key(current_key("lm"))
                self.raw.delete_key(membership_key("lm", 1))
                time.sleep(0.1)
                self.raw.set(current_key("lm"), old_current)  # generation 1 was current once
                self.raw.set(membership_key("lm", 2), old_membership)  # genuine, under another name
                for i in range(FLOOD_PER_ROUND):
                    self.raw.set(f"flood/{self.rounds}/{i}", b"x" * 512)
            except Exception:  # the task ended and its store went: the attack is over
                return
            self.stop.wait(ROUND_S)


@pytest.mark.timeout(420)
def test_a_task_finishes_exact_and_on_time_while_its_store_is_tampered_with(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    fault = "    - {action: break, rank: 1, step: 12}\n"  # every rank re-forms in place: generation 2
    spec = traced_task(trace, "{2: 2.0e9}", ITERATIONS, 0.15, "  faults:\n" + fault)
    with LocalCluster(tmp_path / "cluster", nodes=2, slots=1) as cluster:
        cluster.submit(spec)
        cluster.wait(lambda: bool(store_address(cluster)), 120, "the task's store to listen")
        intruder = Intruder(store_address(cluster))
        cluster.wait(lambda: intruder.copied(current_key("lm")), 30, "generation 1 to be posted current")
        cluster.wait(lambda: intruder.copied(membership_key("lm", 1)), 120, "the injected fault's generation")
        attacking = threading.Thread(target=intruder.attack, daemon=True)
        # The steps slow down while the attack's first rounds run: on a loaded machine the steps
        # left at full pace ended the task (and its store) before them.
        pace(trace, 1.0)
        attacking.start()
        try:
            cluster.wait(lambda: intruder.rounds > 5 or not attacking.is_alive(), 120, "six rounds of attack")
            full_speed(trace)
            events, rows = finish_and_settle(cluster, trace)
        finally:
            intruder.stop.set()
            attacking.join(30)
    kinds, story = [e["kind"] for e in events], story_of(events)
    assert intruder.rounds > 5, f"the attack ran {intruder.rounds} rounds only"
    assert kinds.count("task_launch") == 1, story  # never relaunched from a checkpoint
    assert kinds.count("incident") == 1, story  # the injected fault's, nothing more
    assert "store_values_restored" in kinds, story
    assert not [r for r in rows if r["what"] == "commit_refused"], "a checkpoint was refused"
    assert_ledger_exact(rows, ITERATIONS, world=2)
    assert_ends_exact(tmp_path, "lm", ITERATIONS)

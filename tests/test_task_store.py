"""The worker's side of the task's rendezvous store, against a real TCPStore: forming a group
waits for every member, and a group the coordinator re-forms before they all arrived (a member
failed on the way) is skipped by every member alike, never formed by some and skipped by others."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from unicron.core.protocol import Membership, membership_key
from unicron.train.taskstore import TaskStore

TIMEOUT = timedelta(seconds=20)


def master() -> Any:
    return dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=TIMEOUT, wait_for_workers=False)  # type: ignore[attr-defined]


def arrive_all(store: Any, generation: int, ranks: list[int], world: int) -> list[bool]:
    def one(rank: int) -> bool:
        member = TaskStore(f"127.0.0.1:{store.port}", "lm", TIMEOUT, reconnect_s=1.0)
        return member.arrive(generation, rank, world, TIMEOUT)

    with ThreadPoolExecutor(len(ranks)) as pool:
        return list(pool.map(one, ranks))


def test_every_member_arrived_forms_the_group() -> None:
    assert arrive_all(master(), 3, [0, 1, 2], 3) == [True, True, True]


def test_a_generation_re_formed_before_all_arrived_is_skipped_by_all() -> None:
    store = master()
    successor = Membership(generation=4, world_size=2, ranks={0: 0, 1: 1}, failed=[2])
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(arrive_all, store, 3, [0, 1], 3)  # rank 2 never arrives
        store.set(membership_key("lm", 3), successor.model_dump_json())
        assert waiting.result(timeout=20) == [False, False]
    # A member arriving late (it was slow, not dead) follows the same decision.
    assert arrive_all(store, 3, [2], 3) == [False]

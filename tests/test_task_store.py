"""The worker's side of the task's rendezvous store, against a real TCPStore served the way the
coordinator serves it: forming a group waits for every member, and a group the coordinator
re-forms before they all arrived (a member failed on the way) is skipped by every member alike,
never formed by some and skipped by others. Values not signed with the task's key (written by
anyone who reaches the port: the store has no authentication) are ignored by workers and by the
coordinator, and the store listens on its advertised address only."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist

from unicron.control.act.rendezvous import Rendezvous
from unicron.control.agent.backlog import Backlog
from unicron.control.agent.supervisor import Supervisor
from unicron.core.protocol import (
    Current,
    LaunchWorker,
    Membership,
    StoreMoved,
    current_key,
    membership_key,
    ready_key,
)
from unicron.core.signing import derive, sign
from unicron.core.workerenv import KEYS, STORE_MOVES_KEPT, WorkerEnv
from unicron.train import storeaddress
from unicron.train.taskstore import TaskStore

TIMEOUT = timedelta(seconds=20)
SECRET = b"s" * 64


class Served:
    """The coordinator's side (a Rendezvous) and a raw client of the same store, as an intruder
    who reached its port would hold."""

    def __init__(self) -> None:
        self.rendezvous = Rendezvous("127.0.0.1", SECRET)
        self.port = self.rendezvous.host("lm")
        self.raw: Any = dist.TCPStore("127.0.0.1", self.port, is_master=False, timeout=TIMEOUT)  # type: ignore[attr-defined]

    def member(self) -> TaskStore:
        return TaskStore(f"127.0.0.1:{self.port}", "lm", derive(SECRET, "lm"), TIMEOUT, reconnect_s=1.0)

    def set(self, key: str, value: str) -> None:
        self.rendezvous.set("lm", key, value)
        self.written()

    def restore(self) -> list[str]:
        missing = self.rendezvous.restore("lm")
        self.written()
        return missing

    def written(self) -> None:
        """Returns once the coordinator's writes are in the store: TCPStore sends a write without
        waiting for an answer, so a question on another connection (a member's) could be served
        before it; a question on the writer's own connection is answered only after its writes."""
        self.rendezvous.ready("lm", [current_key("lm")])


def master() -> Served:
    return Served()


def arrive_all(store: Served, generation: int, ranks: list[int], world: int) -> list[bool]:
    def one(rank: int) -> bool:
        return store.member().arrive(generation, rank, world, TIMEOUT)

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


def test_forged_replayed_and_unsigned_values_are_ignored() -> None:
    served = master()
    member = served.member()
    shrink = Membership(generation=4, world_size=1, ranks={0: 0}, failed=[1, 2, 3])
    name = membership_key("lm", 3)
    served.raw.set(name, shrink.model_dump_json())  # unsigned
    assert not member.membership_changed(3)
    assert not member.declared_failed(3, 1)  # rank 1 takes no forgery for its exclusion, nor leaves
    served.raw.set(name, sign(derive(b"x" * 64, "lm"), name, shrink.model_dump_json()))  # another key
    assert not member.membership_changed(3)
    genuine_for_5 = sign(derive(SECRET, "lm"), membership_key("lm", 5), shrink.model_dump_json())
    served.raw.set(name, genuine_for_5)  # the coordinator's, replayed under another generation
    assert not member.membership_changed(3) and not member.abandons_step(3)
    real = Membership(generation=4, world_size=2, ranks={0: 0, 1: 1}, failed=[])
    served.set(name, real.model_dump_json())
    assert member.membership_changed(3) and member.posted(3) == real
    assert not member.abandons_step(3)  # a planned change: the step is finished first
    reattempt = Membership(generation=4, world_size=2, ranks={0: 0, 1: 1}, failed=[], abandon=True)
    served.set(name, reattempt.model_dump_json())
    assert member.abandons_step(3)  # every rank alive, the step abandoned all the same
    # Readiness: a forged announcement does not count; the worker's own does.
    served.raw.set(ready_key("lm", 4, 1), "1")
    assert not served.rendezvous.ready("lm", [ready_key("lm", 4, 1)])
    member.announce_ready(4, 1)
    assert served.rendezvous.ready("lm", [ready_key("lm", 4, 1)])


def test_a_step_boundary_reuses_only_a_recent_no_for_the_same_generation() -> None:
    """The boundary's check takes the answer the reduce's check just got (a round trip a step
    saved); a yes, another generation, or a question asked without reuse always go to the store."""
    served = master()
    member = served.member()
    assert not member.membership_changed(3)  # asked: nothing posted yet
    successor = Membership(generation=4, world_size=1, ranks={0: 0})
    served.set(membership_key("lm", 3), successor.model_dump_json())
    assert not member.membership_changed(3, reuse_s=60.0)  # the recent no, given again
    assert member.membership_changed(3)  # without reuse: asked, and it is posted now
    assert member.membership_changed(3, reuse_s=60.0)  # a yes is never taken back
    assert not member.membership_changed(5)  # another generation's no...
    assert member.membership_changed(3, reuse_s=60.0)  # ...is not this one's: asked


def test_a_forged_membership_does_not_end_a_wait_for_the_real_one() -> None:
    served = master()
    name = membership_key("lm", 7)
    served.raw.set(name, Membership(generation=8, world_size=1, ranks={0: 0}).model_dump_json())
    real = Membership(generation=8, world_size=3, ranks={0: 0, 1: 1, 2: 2})
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(served.member().next_membership, 7, TIMEOUT)
        time.sleep(0.3)
        assert not waiting.done()
        served.set(name, real.model_dump_json())
        assert waiting.result(timeout=20) == real


def test_the_store_listens_on_its_address_only() -> None:
    served = master()
    listening = [
        line.split()[1]
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]
        if line.split()[3] == "0A"
    ]  # state LISTEN: local address as hex ip:port
    assert f"0100007F:{served.port:04X}" in listening  # 127.0.0.1
    assert f"00000000:{served.port:04X}" not in listening  # not 0.0.0.0


def test_a_worker_is_declared_failed_through_the_generations_it_was_carried_into() -> None:
    """A lone worker (generation 2, rank 0) busy in a step while a grow formed generation 3
    (it is rank 0 there) and that group then lost it (generation 4 declares rank 0 failed): it
    learns it is out. Its newcomer is not; nor is anyone before any membership is posted."""
    store = master()
    member = store.member()
    assert not member.declared_failed(2, 0)
    grow = Membership(generation=3, world_size=2, ranks={0: 0})
    store.set(membership_key("lm", 2), grow.model_dump_json())
    assert not member.declared_failed(2, 0)  # a planned grow: the step is still its own
    lost = Membership(generation=4, world_size=1, ranks={1: 0}, failed=[0])
    store.set(membership_key("lm", 3), lost.model_dump_json())
    assert member.declared_failed(2, 0)
    assert not member.declared_failed(3, 1)  # the newcomer goes on


def test_after_a_takeover_a_member_finds_the_store_on_the_new_leaders_host() -> None:
    """The coordinator that launched the worker dies; another takes over on another host (here
    another loopback address) and serves the task's store on the same port. The worker was
    given every coordinator's host (``UNICRON_STORE_HOSTS``) and reads the new membership."""
    old = Served()
    contract = WorkerEnv(task="lm", store=f"127.0.0.1:{old.port}", store_hosts="127.0.0.1,127.0.0.2")
    assert contract.store_addresses() == f"127.0.0.1:{old.port},127.0.0.2:{old.port}"
    member = TaskStore(contract.store_addresses(), "lm", derive(SECRET, "lm"), TIMEOUT, reconnect_s=0.2)
    assert not member.membership_changed(3)
    old.rendezvous.close_all()  # the leader dies with its stores
    new = Rendezvous("127.0.0.2", SECRET)
    assert new.host("lm", old.port) == old.port
    new.set(
        "lm", membership_key("lm", 3), Membership(generation=4, world_size=1, ranks={0: 0}).model_dump_json()
    )
    deadline = time.monotonic() + 20
    while not member.membership_changed(3):  # "no change" while it reconnects in a thread
        assert time.monotonic() < deadline, "the member never found the store at its new address"
        time.sleep(0.1)
    assert member.address == f"127.0.0.2:{old.port}" and member.posted(3).world_size == 1
    # A survivor waiting for its next membership when the leader dies waits on, over a new
    # connection, for the coordinator that takes over (here back at the first address).
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(member.next_membership, 4, TIMEOUT)
        time.sleep(0.5)
        new.close_all()
        time.sleep(1.0)
        again = Rendezvous("127.0.0.1", SECRET)
        assert again.host("lm", old.port) == old.port
        again.set(
            "lm",
            membership_key("lm", 4),
            Membership(generation=5, world_size=2, ranks={0: 0}).model_dump_json(),
        )
        assert waiting.result(timeout=30).generation == 5
    again.close_all()


def test_a_member_follows_its_agents_word_to_a_store_that_moved_port(tmp_path: Path) -> None:
    """The coordinator starts over while another process holds the task's store port: the store
    is served on another port. The member finds it once its agent wrote where (the agent's own
    code, as the coordinator's ``StoreMoved`` order makes it do), and only for a move from the
    port it was launched with: a file of an earlier task of the name is no word of its."""
    import socket

    old = Served()
    agent = Supervisor("n0", tmp_path, tmp_path / "agent.sock", Backlog(), store_hosts=[])
    contract = agent._worker_env(
        LaunchWorker(task="lm", generation=1, rank=0, world_size=1, local_rank=0, argv=[])
    )
    store_file = contract[KEYS["store_file"]]
    launched = f"127.0.0.1:{old.port}"
    agent.store_moved(StoreMoved(task="lm", moved_from=old.port + 1, address="127.0.0.1:1"))  # not its port
    assert storeaddress.current(launched, store_file) == [launched]
    member = TaskStore(launched, "lm", derive(SECRET, "lm"), TIMEOUT, reconnect_s=0.2, store_file=store_file)
    assert not member.membership_changed(3)
    old.rendezvous.close_all()
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # (its old connections wait)
        holder.bind(("127.0.0.1", old.port))
        holder.listen()
        new = Rendezvous("127.0.0.1", SECRET)
        port = new.host("lm", old.port)
    assert port != old.port
    posted = Membership(generation=4, world_size=1, ranks={0: 0})
    new.set("lm", membership_key("lm", 3), posted.model_dump_json())
    agent.store_moved(StoreMoved(task="lm", moved_from=old.port, address=f"127.0.0.1:{port}"))
    deadline = time.monotonic() + 20
    while not member.membership_changed(3):  # "no change" while it reconnects in a thread
        assert time.monotonic() < deadline, "the member never found the store where it moved"
        time.sleep(0.1)
    assert member.address == f"127.0.0.1:{port}" and member.posted(3).world_size == 1
    new.close_all()


def test_a_member_that_missed_a_move_follows_the_moves_after_it(tmp_path: Path) -> None:
    """Two restarts of the coordinator, each with the store's port taken, before the member's
    store stopped answering: its agent keeps every move (its own code writes the file), and the
    member follows them from a port it was launched with, in order; another store's move (an
    earlier task of the name) is passed over, and a move back to a port used before is followed."""
    agent = Supervisor("n0", tmp_path, tmp_path / "agent.sock", Backlog(), store_hosts=[])
    contract = agent._worker_env(
        LaunchWorker(task="lm", generation=1, rank=0, world_size=1, local_rank=0, argv=[])
    )
    store_file, launched = contract[KEYS["store_file"]], "127.0.0.1:5000,10.0.0.2:5000"

    def moved(moved_from: int, address: str) -> list[str]:
        agent.store_moved(StoreMoved(task="lm", moved_from=moved_from, address=address))
        return storeaddress.current(launched, store_file)

    assert moved(7000, "127.0.0.1:7001") == ["127.0.0.1:5000", "10.0.0.2:5000"]  # not its store
    assert moved(5000, "127.0.0.1:5001")[0] == "127.0.0.1:5001"
    assert moved(5001, "10.0.0.2:5002") == ["10.0.0.2:5002", "127.0.0.1:5000", "10.0.0.2:5000"]
    assert moved(5002, "127.0.0.1:5000") == ["127.0.0.1:5000", "10.0.0.2:5000"]  # back where it was
    for i in range(2 * STORE_MOVES_KEPT):
        agent.store_moved(StoreMoved(task="lm", moved_from=6000 + i, address=f"127.0.0.1:{6001 + i}"))
    assert len(Path(store_file).read_text().splitlines()) == STORE_MOVES_KEPT  # the newest kept


def test_what_the_coordinator_posted_is_put_back_after_a_deletion_or_a_replay() -> None:
    """The store takes deletions and writes from anyone: the coordinator puts back what it
    posted (and says which keys), and a worker waiting for a deleted membership gets it then."""
    served = master()
    member = served.member()
    name = membership_key("lm", 3)
    first = Membership(generation=4, world_size=2, ranks={0: 0, 1: 1})
    served.set(name, first.model_dump_json())
    served.set(current_key("lm"), Current(generation=4, launched=1).model_dump_json())
    old_current = served.raw.get(current_key("lm"))
    served.set(current_key("lm"), Current(generation=5, launched=1).model_dump_json())
    assert served.restore() == []  # nothing missing
    served.raw.delete_key(name)
    served.raw.set(current_key("lm"), old_current)  # a genuine old value, replayed
    for i in range(1000):  # a flood of writes to other keys changes nothing of the task's
        served.raw.set(f"junk/{i}", "x" * 100)
    served.raw.check(["junk/999"])  # (an answer on the intruder's connection: its writes are in)
    assert not member.membership_changed(3)  # deleted: no change, for now
    assert served.restore() == [name]  # the one missing; the replaced one written too
    assert member.membership_changed(3) and member.posted(3) == first
    _, _, payload = served.raw.get(current_key("lm")).decode().partition(".")
    assert Current.model_validate_json(payload).generation == 5
    assert served.restore() == []


def test_a_waiting_newcomer_says_again_that_it_is_ready_when_its_word_was_deleted() -> None:
    served = master()
    newcomer = served.member()
    newcomer.announce_ready(4, 1)
    served.raw.delete_key(ready_key("lm", 4, 1))
    with ThreadPoolExecutor(1) as pool:
        arriving = pool.submit(newcomer.arrive, 4, 1, 2, TIMEOUT)
        deadline = time.monotonic() + 15
        while not served.rendezvous.ready("lm", [ready_key("lm", 4, 1)]):
            assert time.monotonic() < deadline, "the newcomer never said it was ready again"
            time.sleep(0.05)
        served.member().arrive(4, 0, 2, TIMEOUT)  # its peer comes: the group forms
        assert arriving.result(timeout=20)


def test_a_fault_is_claimed_once_and_asking_again_is_the_claimant_s_own_answer() -> None:
    """A claim whose answer was lost (the store went away) may have landed: asked again, it is
    still the claimant's; any other worker, and the coordinator marking it after a restart, find
    it taken."""
    store = master()
    first, second = store.member(), store.member()
    assert first.claim(0) is True and first.claim(0) is True  # asked again: still its own
    assert second.claim(0) is False
    store.rendezvous.claim("lm", 0)  # the coordinator's mark does not take it over
    assert first.claim(0) is True and second.claim(0) is False
    store.rendezvous.claim("lm", 1)  # marked first (a fault injected before a restart): nobody's
    assert first.claim(1) is False and second.claim(1) is False


# A task's store served by a process of its own, which the test can stop as a paused coordinator is.
SERVE = """
import time
from datetime import timedelta
import torch.distributed as dist
store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
print(store.port, flush=True)
time.sleep(600)
"""


def test_a_store_that_stops_answering_holds_up_no_membership_check() -> None:
    """A coordinator paused (SIGSTOP) answers nothing, and torch's client waits past its own
    timeout: the check a step makes is given up (``taskstore.ANSWER_S``) and says "no change",
    the next one is not asked while that question is unanswered, and once the store answers again
    the checks see what it holds."""
    server = subprocess.Popen([sys.executable, "-c", SERVE], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        key = derive(SECRET, "lm")
        member = TaskStore(f"127.0.0.1:{port}", "lm", key, TIMEOUT, reconnect_s=1.0)
        assert not member.membership_changed(3)
        name = membership_key("lm", 3)
        raw: Any = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=TIMEOUT)  # type: ignore[attr-defined]
        os.kill(server.pid, signal.SIGSTOP)
        try:
            assert not member.membership_changed(3)  # given up: the store is away
            assert not member.membership_changed(3)  # the last question still unanswered
        finally:
            os.kill(server.pid, signal.SIGCONT)
        successor = Membership(generation=4, world_size=1, ranks={0: 0})
        raw.set(name, sign(key, name, successor.model_dump_json()))
        deadline = time.monotonic() + 60
        while not member.membership_changed(3):
            assert time.monotonic() < deadline, "the checks never saw the store again"
            time.sleep(0.05)
        assert member.posted(3) == successor
    finally:
        server.kill()
        server.wait()

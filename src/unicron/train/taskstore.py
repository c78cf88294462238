"""The task's rendezvous store as a worker uses it: where the coordinator posts memberships,
where newcomers say they are ready and where generation-0 faults are claimed.

Training must not depend on the coordinator being up: while its store is unreachable, or does
not answer (a coordinator paused: ``asking.py``), the membership checks say "no change", and the
connection is re-made now and then (a restarted coordinator serves the store on the same port).

Anyone who reaches the store's port can write to it, so the values that steer workers are
signed with the task's key (``core.signing``): a membership or identity that does not open with
it is treated as not there (and said once on stderr), and readiness is announced signed. A value
deleted or replaced is waited for, never taken as an answer: the coordinator puts back what it
posted (``control/act/rendezvous.py``), and a newcomer says it is ready again while it waits.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from unicron.core.protocol import Membership, fault_claim_key, membership_key, ready_key, spare_key
from unicron.core.reachability import Reachability
from unicron.core.signing import opened, sign
from unicron.core.workerenv import addresses
from unicron.train.asking import Asker
from unicron.train.fencing import served
from unicron.train.iteration import StopRequested
from unicron.train.storeaddress import told

# A membership check the store does not answer within this is taken as "no change" (``asking.py``:
# a paused coordinator answers nothing; on a working one the check takes a round trip, well under
# a millisecond on a cluster's network).
ANSWER_S = 1.0
MEMBERSHIP_POLL_S = 0.02  # a wait for a membership asks the store this often at first
QUIET_STORE_S = 5.0  # ... and connects again when the store has not answered for this long
STOP_LOOK_S = 0.25  # ... then this often (and so sees a stop request within this)
READY_AGAIN_S = 1.0  # a newcomer waiting for its group says it is ready again this often


class TaskStore:
    def __init__(
        self,
        address: str,
        task: str,
        key: str,
        timeout: timedelta,
        reconnect_s: float,
        store_file: str | None = None,
    ) -> None:
        """``address``: comma-separated, the one the worker was launched with first, then where
        another coordinator would serve the store once it leads (``WorkerEnv.store_addresses``).
        ``store_file``: where its agent says the store moved (``storeaddress.py``)."""
        self.addresses = addresses(address)
        self.store_file = store_file
        self.address = self.addresses[0]  # the one that served last
        self.task, self.timeout, self.reconnect_s = task, timeout, reconnect_s
        self.key = key
        self.raw: Any = self._connect(timeout)
        self._reconnect_at = 0.0
        self._reconnecting: threading.Thread | None = None
        self._refused: set[str] = set()
        self.claimant = f"{os.getpid()}-{secrets.token_hex(8)}"  # this process, in fault claims
        self._unchanged: tuple[int, float] | None = None  # (generation, when asked): nothing posted
        self._announced: tuple[str, str] | None = None  # a newcomer's readiness (key, signed value)
        # Reconnections back off from half a second to ``reconnect_s``, jittered (a cluster's
        # workers do not all return at once to a restarted coordinator's stores).
        self.link = Reachability(f"the rendezvous store at {address}", min(0.5, reconnect_s), reconnect_s)
        self.asker = Asker(ANSWER_S, "store-checks")  # the checks made while training goes on

    def _say(self, line: str | None, more: str = "") -> None:
        if line is not None:
            print(f"{self.task}: {line}{more}", file=sys.stderr, flush=True)

    def _read(self, name: str) -> str | None:
        """The payload under ``name`` if it is signed with the task's key, else None."""
        payload = opened(self.key, name, self.raw.get(name))
        if payload is None and name not in self._refused:
            self._refused.add(name)
            print(f"{name}: a value not signed with the task's key; ignored", file=sys.stderr)
        return payload

    def announce_ready(self, generation: int, rank: int) -> None:
        """A newcomer of ``generation`` says it is about to join its live peers."""
        name = ready_key(self.task, generation, rank)
        self._announced = (name, sign(self.key, name, "1"))
        self.raw.set(*self._announced)

    def _connect(self, timeout: timedelta, address: str | None = None) -> Any:
        host, port = (address or self.address).rsplit(":", 1)
        return dist.TCPStore(host, int(port), is_master=False, timeout=timeout)  # type: ignore[attr-defined]

    def membership_changed(self, generation: int, reuse_s: float = 0.0) -> bool:
        """Whether the coordinator posted the membership that follows ``generation``.
        ``reuse_s``: an answer of no for the same generation that the store gave to a question
        sent less than ``reuse_s`` seconds ago is given again without asking (a step boundary
        right after the check that ends a step's reduce: a store round trip per step saved; a
        planned change can wait milliseconds). A question sent before a freeze is never that
        recent afterwards (the clock runs on while the process is stopped)."""
        asked = time.monotonic()
        last = self._unchanged
        if reuse_s and last is not None and last[0] == generation and asked - last[1] < reuse_s:
            return False
        try:
            name = membership_key(self.task, generation)
            posted = self.asker.ask(lambda: bool(self.raw.check([name])) and self._read(name) is not None)
            self._unchanged = None if posted else (generation, asked)
            if self.link.away:
                self._say(self.link.reached(time.monotonic()))
            return posted
        except Exception as exc:
            now = time.monotonic()
            reconnecting = self._reconnecting is not None and self._reconnecting.is_alive()
            if now >= self._reconnect_at and not reconnecting:  # each attempt counts one failure
                delay, line = self.link.failed(now, exc)
                self._say(line, "; training goes on meanwhile")
                self._reconnect_at = now + delay
                # In a thread of its own: a connection attempt waits up to two seconds for a
                # store that is not there, and the step must not wait with it.
                self._reconnecting = threading.Thread(target=self._reconnect, daemon=True)
                self._reconnecting.start()
            return False

    def _reconnect(self) -> None:
        """Where its agent says the store moved, if it did; then the last address that served,
        then the others: after a takeover the store is served by the new leader, on its host."""
        start = self.addresses.index(self.address) if self.address in self.addresses else 0
        candidates = self.addresses[start:] + self.addresses[:start]
        moved = told(self.store_file, self.addresses)
        for address in ([moved] if moved is not None else []) + [a for a in candidates if a != moved]:
            if not served(address, 1.0):
                continue  # a coordinator that does not lead keeps the port closed: next
            with contextlib.suppress(Exception):
                raw = self._connect(timedelta(seconds=2), address)
                raw.set_timeout(self.timeout)
                self.raw, self.address = raw, address
                self.link.what = f"the rendezvous store at {address}"  # (what the next lines name)
                return

    def abandons_step(self, generation: int) -> bool:
        """Whether the posted membership abandons the step in progress: a recovery, of ranks
        declared failed (a collective waiting for them will never finish) or of a collective
        stuck with every rank alive (a reattempt in place)."""
        if not self.membership_changed(generation):
            return False
        posted = self.posted(generation)
        return posted.abandon or bool(posted.failed)

    def declared_failed(self, generation: int, rank: int) -> bool:
        """Whether the memberships posted after ``generation`` declare this worker (``rank`` in
        it) failed, following it through the generations it was carried into meanwhile (a grow
        posted while it was busy, then a failure of that group)."""
        for _ in range(64):  # far more generations than can pass within one step
            if not self.membership_changed(generation):
                return False
            try:
                posted = self.posted(generation)
            except Exception:
                return False  # the store went away meanwhile (a coordinator restart): not known
            if rank in posted.failed:
                return True
            if rank not in posted.ranks:
                return False  # left by a planned change, after finishing its step
            generation, rank = posted.generation, posted.ranks[rank]
        return False

    def posted(self, generation: int) -> Membership:
        """The membership that follows ``generation`` (posted and signed: membership_changed)."""
        payload = self._read(membership_key(self.task, generation))
        if payload is None:
            raise RuntimeError(f"generation {generation}: no signed membership follows it")
        return Membership.model_validate_json(payload)

    def next_membership(
        self, generation: int, timeout: timedelta, stop: Callable[[], bool] = lambda: False
    ) -> Membership:
        """Wait for the (signed) membership that follows ``generation``. The store may go away
        meanwhile (its coordinator died): the wait goes on over a new connection, to whichever
        address serves the store again (the coordinator that takes over), until ``timeout``.
        A worker asked to stop meanwhile (``stop()``) stops waiting (``StopRequested``).

        The store is asked (``check``) rather than waited on: a blocking wait cannot be cut short
        by the stop's signal, and one in rounds short enough to see it within the stop's grace
        period makes torch log a warning for every round that times out. The first second,
        when a recovery's membership usually comes, is asked about often (as ``arrive`` does)."""
        name = membership_key(self.task, generation)
        began = time.monotonic()
        deadline = began + timeout.total_seconds()
        try:
            while (now := time.monotonic()) < deadline:
                if stop():
                    raise StopRequested(f"generation {generation}: asked to stop while waiting to rejoin")
                try:
                    # A store that does not answer (its host cut off) is given up on this soon.
                    self.raw.set_timeout(timedelta(seconds=QUIET_STORE_S))
                    if self.raw.check([name]) and (payload := self._read(name)) is not None:
                        return Membership.model_validate_json(payload)
                except Exception:  # the store went away, or is silent: connect again
                    self._reconnect()
                time.sleep(MEMBERSHIP_POLL_S if now - began < 1.0 else STOP_LOOK_S)
        finally:
            with contextlib.suppress(Exception):
                self.raw.set_timeout(self.timeout)
        raise TimeoutError(f"generation {generation}: no signed membership within {timeout}")

    def arrive(self, generation: int, rank: int, world_size: int, timeout: timedelta) -> bool:
        """Wait until every member of ``generation`` has arrived to form its group (True), or
        until the coordinator re-formed it before they all did (False: a member failed on the
        way, and would leave the others waiting in the group's rendezvous until its timeout).
        One atomic decision per generation, so that no member forms a group the others skip."""
        prefix = f"{self.task}/arrival/{generation}"
        if int(self.raw.add(f"{prefix}/count", 1)) == world_size:
            self.raw.compare_set(f"{prefix}/decision", "", "join")
        deadline = time.monotonic() + timeout.total_seconds()
        said = time.monotonic()
        while not self.raw.check([f"{prefix}/decision"]):
            if self._announced is not None and time.monotonic() - said > READY_AGAIN_S:
                self.raw.set(*self._announced)  # (someone may have deleted it: the store is open)
                said = time.monotonic()
            if self.membership_changed(generation):
                self.raw.compare_set(f"{prefix}/decision", "", "skip")
            elif time.monotonic() > deadline:
                raise TimeoutError(f"generation {generation}: not every member arrived within {timeout}")
            time.sleep(0.02)
        return bool(self.raw.get(f"{prefix}/decision") == b"join")

    def wait_to_be_used(
        self, spare_rank: int, stop: Callable[[], bool], gone_for_s: float
    ) -> dict[str, Any] | None:
        """A hot spare's wait for the identity the coordinator gives it (None: not needed after
        all, or its task is gone)."""
        key = spare_key(self.task, spare_rank)
        while self._wait_for_key(key, stop, gone_for_s):
            payload = self._read(key)
            if payload is not None:
                return dict(json.loads(payload))
            time.sleep(0.5)  # a forgery: wait for the coordinator's
        return None

    def _wait_for_key(self, key: str, stop: Callable[[], bool], gone_for_s: float) -> bool:
        """Wait until ``key`` is set (True), or until ``stop()`` says so or the store has been
        unreachable for ``gone_for_s`` (False). A wait that fails at once means the store is
        gone (its task ended, or the coordinator is down): retry calmly rather than spin."""
        gone_since: float | None = None
        while not stop():
            began = time.monotonic()
            try:
                self.raw.wait([key], timedelta(seconds=1))
                return True
            except Exception:
                if time.monotonic() - began >= 0.9:
                    gone_since = None  # an ordinary time-out: look at stop() again
                    continue
            gone_since = gone_since or began
            if began - gone_since > gone_for_s:
                print(f"{key}: the rendezvous store is gone; giving up", file=sys.stderr)
                return False
            time.sleep(1.0)
        return False

    def claim(self, index: int) -> bool | None:
        """Whether this worker is the first to reach a generation-0 fault (atomic in the store);
        None where the store did not answer. Asking again is safe: a claim whose answer was lost
        (the store went away meanwhile) may have landed, and then it is this worker's, not lost to
        itself: the claimant's name is stored, not a count (the coordinator's own mark of a claim,
        after a restart, is its own name: anyone's but this worker's)."""
        key, mine = fault_claim_key(self.task, index), self.claimant
        try:
            return bytes(self.raw.compare_set(key, "", mine)) == mine.encode()
        except Exception:
            return None

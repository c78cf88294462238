"""Which coordinator leads, when several share one etcd: the one whose id the leader key holds.

The key is created only where it does not exist (a transaction comparing its create revision
with 0) and is attached to a lease of ``ttl_s`` seconds that the leader renews three times per
TTL. A leader that dies (kill -9), hangs or is cut off from etcd stops renewing; etcd deletes
the key when the lease runs out and a standby, which polls for that, takes it. The store's
every write compares the key with this leader's value (``EtcdBackend.fence``), so an old
leader that still runs writes nothing once the key is another's. A leader that cannot renew
within its TTL gives up at once (``lost``): it may no longer lead, and another may already.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass

from unicron.control.store.backend import Backend
from unicron.control.store.etcdbackend import EtcdBackend, EtcdClients, decode, encode


@dataclass(frozen=True)
class Leader:
    id: str  # unique per coordinator process
    url: str  # where it serves agents and users

    def value(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


def lost(last_renewed: float, now: float, ttl_s: float) -> bool:
    """Whether a leader last renewed at ``last_renewed`` may have lost its lease by ``now``: it
    gives up a little before the TTL ends, so that it stops before a successor starts."""
    return now - last_renewed >= 0.8 * ttl_s


class Leadership:
    def __init__(self, backend: EtcdBackend, me: Leader, ttl_s: float) -> None:
        self.clients: EtcdClients = backend.clients
        self.backend = backend
        self.key = backend.key("leader")
        self.me = me
        self.ttl_s = ttl_s
        self.lease: str | None = None

    def leader(self) -> Leader | None:
        """The coordinator that leads now, as the leader key says (None: nobody)."""
        found = self.clients.post("kv/range", {"key": encode(self.key)}).get("kvs", [])
        return Leader(**json.loads(decode(found[0]["value"]))) if found else None

    def _try(self) -> bool:
        lease = str(self.clients.post("lease/grant", {"TTL": max(1, round(self.ttl_s))})["ID"])
        absent = {"key": encode(self.key), "result": "EQUAL", "target": "CREATE", "create_revision": 0}
        put = {"request_put": {"key": encode(self.key), "value": encode(self.me.value()), "lease": lease}}
        if self.clients.post("kv/txn", {"compare": [absent], "success": [put]}).get("succeeded", False):
            self.lease = lease
            self.backend.fence = (self.key, self.me.value())
            return True
        self.clients.post("lease/revoke", {"ID": lease})
        return False

    def campaign(self, poll_s: float = 0.2, stop: Callable[[], bool] = lambda: False) -> bool:
        """Wait until this coordinator leads (True), or ``stop`` says to give up (False)."""
        while not stop():
            try:
                if self._try():
                    return True
            except ConnectionError:
                pass  # etcd unreachable: a standby waits like any other
            time.sleep(poll_s)
        return False

    def renew(self) -> bool:
        """Renew the lease once; False when it ran out (another may lead now)."""
        if self.lease is None:
            return False
        answer = self.clients.post("lease/keepalive", {"ID": self.lease})
        return int(answer.get("result", {}).get("TTL", -1)) > 0

    def keep(self, on_lost: Callable[[str], None], clock: Callable[[], float] = time.monotonic) -> None:
        """Renew in a thread of its own until the lease is lost; then ``on_lost(why)``."""

        def renewing() -> None:
            renewed = clock()
            while True:
                time.sleep(self.ttl_s / 6)
                try:
                    if self.renew():
                        renewed = clock()
                    else:
                        return on_lost("the lease ran out")
                except Exception:
                    pass
                if lost(renewed, clock(), self.ttl_s):
                    return on_lost(f"etcd did not renew the lease within {0.8 * self.ttl_s:.1f} s")

        threading.Thread(target=renewing, name="leadership", daemon=True).start()

    def resign(self) -> None:
        """Give the leadership up now (a clean shutdown): a standby need not wait for the TTL."""
        if self.lease is not None:
            self.clients.post("lease/revoke", {"ID": self.lease})
            self.lease = None


def abdicate(why: str) -> None:
    """This coordinator no longer leads: it stops at once (its supervisor starts it again, as a
    standby). Exiting, rather than carrying on read-only, leaves nothing half-done behind."""
    print(f"coordinator: no longer the leader ({why}); exiting", file=sys.stderr, flush=True)
    os._exit(3)


def lead(backend: Backend, url: str, ttl_s: float) -> Leadership | None:
    """With etcd, wait until this coordinator leads and keep the lease from then on; with SQLite
    (one coordinator, nothing to elect), None at once."""
    if not isinstance(backend, EtcdBackend):
        return None
    me = Leader(id=f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}", url=url)
    leadership = Leadership(backend, me, ttl_s)
    print(f"coordinator {me.id}: standing by for the leadership", file=sys.stderr, flush=True)
    leadership.campaign()
    print(f"coordinator {me.id}: leading", file=sys.stderr, flush=True)
    leadership.keep(abdicate)
    return leadership

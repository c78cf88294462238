"""Per-task rendezvous stores, held by the coordinator so that they outlive every worker.

Each task gets one ``torch.distributed.TCPStore``; each generation of its workers uses a fresh
key prefix (``<task>/g<generation>``), because reusing a prefix collides with the keys the last
membership left behind. Workers never host a store, so a dead worker cannot take the rendezvous
with it. A store listens on the coordinator's advertised address only (a socket bound here and
handed to torch, whose own server would listen on every interface), and every value written to
steer workers is signed with the task's key (``core.signing``).

Signing stops forgeries, not deletions or replays: the store has no authentication. So the
coordinator keeps what it posted and writes it again (``restore``, about once a second): a
deleted or replaced value is the coordinator's again before a worker that found it missing or
stale has stopped asking (``train/fencing.py``, ``train/taskstore.py``). A store call that finds a key gone
between asking and reading waits at most ``STORE_CALL_S``, not torch's five minutes.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from datetime import timedelta
from typing import Any

from unicron.core.protocol import fault_claim_key
from unicron.core.signing import derive, opened, sign

STORE_CALL_S = 2.0  # the coordinator's own calls to a task's store wait at most this long
# What is kept of each task's posts to put back: as many memberships as a worker follows
# (``fencing.MAX_HOPS``, 64) and as many hot spares' identities, and the current generation.
POSTED_PER_TASK = 128


def listening(host: str, port: int) -> socket.socket:
    """A socket listening on ``host`` only, on ``port`` if free, else on any port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.bind((host, 0))
    sock.listen(512)
    return sock


def _import_torch() -> None:
    with contextlib.suppress(ImportError):  # said where it is needed (``host``)
        import torch.distributed  # noqa: F401


class Rendezvous:
    def __init__(self, host: str, secret: bytes) -> None:
        # torch takes over a second to import. Imported at the first launch, on the service's
        # loop, it stopped heartbeats and long polls for all that time; imported before the
        # service listens, it held up every coordinator's start (and a standby's readiness) as
        # long. So it is imported beside the start-up, in a thread: the loop loses the lock only
        # in slices meanwhile, and a launch waits for what is left of it (``host``).
        self._torch = threading.Thread(target=_import_torch, name="import-torch", daemon=True)
        self._torch.start()
        self.host_address = host
        self.secret = secret
        self._stores: dict[str, Any] = {}
        self._posted: dict[str, dict[str, str]] = {}  # task -> key -> signed value, oldest first
        self._unwritten: dict[str, set[str]] = {}  # task -> kept keys whose write failed
        self._hosted = 0  # stores hosted so far: each one's number tells it from a later one
        self._epochs: dict[str, int] = {}  # task -> the number of the store it has now
        # Posts are written from their own thread (``posting.py``), the rest on the loop: the
        # maps change under ``_lock`` (torch's store serialises its own calls), and the writes
        # of kept values are made one at a time (``_writing``), so that a put-back never writes
        # a value older than one a post has just written over it.
        self._lock = threading.Lock()
        self._writing = threading.Lock()

    def key(self, task: str) -> str:
        """The task's store key, for its workers' environment."""
        return derive(self.secret, task)

    def host(self, task: str, port: int = 0) -> int:
        """Serve the task's store (on ``port`` if free, else on any port); return the port."""
        if task in self._stores:
            return int(self._stores[task].port)
        self._torch.join()
        import torch.distributed as dist  # the service needs torch; the planner does not

        sock = listening(self.host_address, port)
        bound = sock.getsockname()[1]
        # The store takes the socket over (and closes it when it is freed).
        store = dist.TCPStore(  # type: ignore[attr-defined]
            self.host_address,
            bound,
            is_master=True,
            wait_for_workers=False,
            master_listen_fd=sock.detach(),
        )
        # (Set once it serves: the timeout also bounds its own first connection, which a loaded
        # host can take seconds to make.)
        store.set_timeout(timedelta(seconds=STORE_CALL_S))
        with self._lock:
            self._stores[task] = store
            self._hosted += 1
            self._epochs[task] = self._hosted
        return int(store.port)

    def epoch(self, task: str) -> int | None:
        """The number of the store the task has now (None: none): a post made for it must not
        land in a later task's of the same name (``posting.py``)."""
        with self._lock:
            return self._epochs.get(task)

    def claim(self, task: str, index: int) -> None:
        """Mark the task's generation-0 fault ``index`` as claimed (``train.faults``), unless a
        worker claimed it already (a claim holds its claimant's name: ``TaskStore.claim``)."""
        self._stores[task].compare_set(fault_claim_key(task, index), "", "coordinator")

    def set(self, task: str, key: str, value: str, epoch: int | None = None) -> None:
        """Post ``value`` under ``key``, signed, and keep it to put back (``restore``): kept
        first, so that a write that fails is made again. A task whose store is gone (it ended),
        or is not the one numbered ``epoch`` (a later task of the name), is posted nothing."""
        signed = sign(self.key(task), key, value)
        with self._writing:
            with self._lock:
                store = self._stores.get(task)
                if store is None or epoch not in (None, self._epochs.get(task)):
                    return
                posted = self._posted.setdefault(task, {})
                posted.pop(key, None)  # (a key written again moves to the newest end)
                posted[key] = signed
                while len(posted) > POSTED_PER_TASK + 1:
                    del posted[next(iter(posted))]
                self._unwritten.setdefault(task, set()).add(key)
            store.set(key, signed)
            with self._lock:
                self._unwritten.get(task, set()).discard(key)

    def restore(self, task: str) -> list[str]:
        """Write every kept value of the task's again (someone may have deleted or replaced it:
        the store takes writes from anyone); returns the keys that were missing. Written blind,
        never read back: a replaced value may be as large as the store takes (megabytes), and
        reading it on the coordinator's loop was a way to stall it. Two round trips a task."""
        with self._writing:
            with self._lock:
                store, posted = self._stores.get(task), dict(self._posted.get(task, {}))
                unwritten = set(self._unwritten.pop(task, set()))
            if store is None or not posted:
                return []
            keys = list(posted)
            missing = [] if store.check(keys) else [key for key in keys if not store.check([key])]
            store.multi_set(keys, [posted[key] for key in keys])
        # (a value whose own write failed was never there: written now, not counted as deleted)
        return [key for key in missing if key not in unwritten]

    def ready(self, task: str, keys: list[str]) -> bool:
        """Whether every key holds a value signed by the task's workers (newcomers announce
        themselves this way); a forged one counts as absent."""
        store = self._stores.get(task)
        if store is None or not store.check(keys):
            return False
        secret = self.key(task)
        return all(opened(secret, key, store.get(key)) is not None for key in keys)

    def close(self, task: str) -> None:
        with self._lock:
            self._stores.pop(task, None)
            self._posted.pop(task, None)
            self._unwritten.pop(task, None)
            self._epochs.pop(task, None)

    def close_all(self) -> None:
        with self._lock:
            self._stores.clear()
            self._posted.clear()
            self._unwritten.clear()
            self._epochs.clear()

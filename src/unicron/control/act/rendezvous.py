"""Per-task rendezvous stores, held by the coordinator so that they outlive every worker.

Each task gets one ``torch.distributed.TCPStore``; each generation of its workers uses a fresh
key prefix (``<task>/g<generation>``), because reusing a prefix collides with the keys the last
membership left behind. Workers never host a store, so a dead worker cannot take the rendezvous
with it. A store listens on the coordinator's advertised address only (a socket bound here and
handed to torch, whose own server would listen on every interface), and every value written to
steer workers is signed with the task's key (``core.signing``).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import TYPE_CHECKING, Any

from unicron.control.store.secret import load_or_create_secret
from unicron.core.protocol import fault_claim_key
from unicron.core.signing import derive, opened, sign

if TYPE_CHECKING:
    from unicron.control.context import CoordinatorSettings


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

    @classmethod
    def serving(cls, settings: CoordinatorSettings) -> Rendezvous:
        """The coordinator's: on its advertised address, keys derived from the cluster secret."""
        return cls(settings.advertise_host, load_or_create_secret(settings.state_dir))

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
            self.host_address, bound, is_master=True, wait_for_workers=False, master_listen_fd=sock.detach()
        )
        self._stores[task] = store
        return int(store.port)

    def claim(self, task: str, index: int) -> None:
        """Mark the task's generation-0 fault ``index`` as claimed (``train.faults``)."""
        self._stores[task].add(fault_claim_key(task, index), 1)

    def set(self, task: str, key: str, value: str) -> None:
        self._stores[task].set(key, sign(self.key(task), key, value))

    def ready(self, task: str, keys: list[str]) -> bool:
        """Whether every key holds a value signed by the task's workers (newcomers announce
        themselves this way); a forged one counts as absent."""
        store = self._stores.get(task)
        if store is None or not store.check(keys):
            return False
        secret = self.key(task)
        return all(opened(secret, key, store.get(key)) is not None for key in keys)

    def close(self, task: str) -> None:
        self._stores.pop(task, None)

    def close_all(self) -> None:
        self._stores.clear()

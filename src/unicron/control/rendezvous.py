"""Per-task rendezvous stores, held by the coordinator so that they outlive every worker.

Each task gets one ``torch.distributed.TCPStore``; each generation of its workers uses a fresh
key prefix (``<task>/g<generation>``), because reusing a prefix collides with the keys the last
membership left behind. Workers never host a store, so a dead worker cannot take the rendezvous
with it.
"""

from __future__ import annotations

from typing import Any


class Rendezvous:
    def __init__(self, host: str) -> None:
        # Imported now, at start-up: importing torch takes seconds, and done at the first launch
        # it would block the service's loop, so that heartbeats and long polls time out.
        import torch.distributed  # noqa: F401

        self.host_address = host
        self._stores: dict[str, Any] = {}

    def host(self, task: str, port: int = 0) -> int:
        """Serve the task's store (on ``port`` if free, else on any port); return the port."""
        if task in self._stores:
            return int(self._stores[task].port)
        import torch.distributed as dist  # the service needs torch; the planner does not

        try:
            store = dist.TCPStore(self.host_address, port, is_master=True, wait_for_workers=False)  # type: ignore[attr-defined]
        except (RuntimeError, OSError):
            store = dist.TCPStore(self.host_address, 0, is_master=True, wait_for_workers=False)  # type: ignore[attr-defined]
        self._stores[task] = store
        return int(store.port)

    def set(self, task: str, key: str, value: str) -> None:
        self._stores[task].set(key, value)

    def ready(self, task: str, keys: list[str]) -> bool:
        """Whether every key exists (newcomers announce themselves this way)."""
        store = self._stores.get(task)
        return store is not None and bool(store.check(keys))

    def close(self, task: str) -> None:
        self._stores.pop(task, None)

    def close_all(self) -> None:
        self._stores.clear()

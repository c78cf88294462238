"""The store's etcd backend (``--store etcd://host:port,host:port[/prefix]``): each row one key
holding its JSON, each change one etcd transaction, the event log keys in id order.

Keys under the prefix (``/unicron`` unless the URL names one)::

    tasks/<name>   nodes/<name>   workers/<task>/<generation>/<rank>   counted/<task>/<g>/<r>
    kept/<name>    events/<id, 16 digits>   leader (leadership.py)

Spoken over etcd's v3 JSON gateway with ``etcd3gw`` (OpenStack's maintained client). A request
that cannot reach one endpoint goes to the next. When this coordinator leads through an etcd
lease (``leadership.py``), every write carries the comparison ``fence`` gives: the leader key
still holds this coordinator's id. A write refused by it raises :class:`Fenced`, so a leader
that lost its lease (a partition, a stall longer than the TTL) writes nothing more.

etcd refuses a transaction of more than ``--max-txn-ops`` operations (128 by default); a
launch of many workers is one transaction, so run etcd with a larger limit (the test harness
uses 10,000).
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import urlsplit

from unicron.brain.records import EventRecord, NodeRecord, TaskRecord, WorkerRecord
from unicron.control.store.backend import Change, Delete, Fenced, Loaded, Table
from unicron.core.errors import UsageError
from unicron.core.extras import require

PAGE = 1000  # keys per range request when scanning the event log
EVENT_DIGITS = 16


def encode(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def decode(encoded: str) -> str:
    return base64.b64decode(encoded).decode()


def _end_of(prefix: str) -> str:
    """The first key after every key that starts with ``prefix``."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def parse_url(url: str) -> tuple[list[tuple[str, int]], str]:
    """``etcd://h1:p1,h2:p2/prefix`` -> the endpoints and the key prefix; a clear error else."""
    parts = urlsplit(url)
    endpoints: list[tuple[str, int]] = []
    for item in filter(None, parts.netloc.split(",")):
        host, _, port = item.rpartition(":")
        if not host or not port.isdigit():
            raise UsageError(f"--store {url}: {item!r} is not host:port; write etcd://host:2379,host2:2379")
        endpoints.append((host, int(port)))
    if parts.scheme != "etcd" or not endpoints:
        raise UsageError(f"--store {url}: write etcd://host:port[,host:port...][/prefix] or a file path")
    return endpoints, (parts.path.rstrip("/") or "/unicron")


class EtcdClients:
    """Requests to the first endpoint that answers (kept until it stops answering). The client
    library is the ``etcd`` extra's, imported here: a coordinator on SQLite, which imports this
    module for the leadership's types, needs none of it (``core/extras.py``)."""

    def __init__(self, endpoints: list[tuple[str, int]], timeout_s: float = 5.0) -> None:
        client = require("etcd3gw.client", "etcd", "a store on etcd").Etcd3Client
        self.clients = [client(host=h, port=p, timeout=timeout_s, api_path="/v3/") for h, p in endpoints]
        self.current = 0
        self._lock = threading.Lock()

    def post(self, path: str, body: dict[str, Any]) -> Any:
        from etcd3gw.exceptions import ConnectionFailedError, ConnectionTimeoutError  # (see above)

        with self._lock:
            error: Exception | None = None
            for attempt in range(len(self.clients)):
                client = self.clients[(self.current + attempt) % len(self.clients)]
                try:
                    answer = client.post(client.get_url(path), json=body)
                except (ConnectionFailedError, ConnectionTimeoutError) as failed:
                    error = failed
                    continue
                self.current = (self.current + attempt) % len(self.clients)
                return answer
            raise ConnectionError(f"no etcd endpoint answered: {error}")


class EtcdBackend:
    def __init__(self, clients: EtcdClients, prefix: str = "/unicron") -> None:
        self.clients = clients
        self.prefix = prefix.rstrip("/")
        self.fence: tuple[str, str] | None = None  # (leader key, this coordinator's id) once it leads

    @classmethod
    def from_url(cls, url: str) -> EtcdBackend:
        endpoints, prefix = parse_url(url)
        return cls(EtcdClients(endpoints), prefix)

    def key(self, table: str, *parts: str | int) -> str:
        return "/".join([self.prefix, table, *map(str, parts)])

    # ------------------------------------------------------------ reads
    def _range(self, start: str, end: str, limit: int = 0, descending: bool = False) -> list[tuple[str, Any]]:
        body: dict[str, Any] = {"key": encode(start), "range_end": encode(end), "limit": limit}
        body |= {"sort_order": "DESCEND" if descending else "ASCEND", "sort_target": "KEY"}
        answer = self.clients.post("kv/range", body)
        return [(decode(kv["key"]), json.loads(decode(kv.get("value", "")))) for kv in answer.get("kvs", [])]

    def _rows(self, table: Table) -> list[Any]:
        prefix = self.key(table.value) + "/"
        return [value for _, value in self._range(prefix, _end_of(prefix))]

    def load(self) -> Loaded:
        counted = {(r["task"], r["generation"], r["rank"]): r["step"] for r in self._rows(Table.COUNTED)}
        return Loaded(
            tasks=[TaskRecord.of(r) for r in self._rows(Table.TASKS)],
            nodes=[NodeRecord.of(r) for r in self._rows(Table.NODES)],
            workers=[WorkerRecord.of(r) for r in self._rows(Table.WORKERS)],
            counted=counted,
            kept={r["name"]: r["value"] for r in self._rows(Table.KEPT)},
            last_event_id=self._last_event_id(),
        )

    # ------------------------------------------------------------ writes
    def _txn(self, operations: list[dict[str, Any]], absent: Sequence[str] = ()) -> None:
        """Run ``operations`` if this coordinator still leads, and only where no key of
        ``absent`` exists yet (else :class:`FileExistsError`)."""
        compare: list[dict[str, Any]] = []
        if self.fence is not None:
            leader_key, me = self.fence
            compare.append(
                {"key": encode(leader_key), "result": "EQUAL", "target": "VALUE", "value": encode(me)}
            )
        compare += [
            {"key": encode(key), "result": "EQUAL", "target": "CREATE", "create_revision": 0}
            for key in absent
        ]
        answer = self.clients.post("kv/txn", {"compare": compare, "success": operations})
        if not compare or answer.get("succeeded", False):
            return
        if not self._leads():
            raise Fenced(f"{self.fence[1] if self.fence else ''} no longer leads: the write was refused")
        raise FileExistsError(", ".join(absent))

    def _leads(self) -> bool:
        if self.fence is None:
            return True
        leader_key, me = self.fence
        found = self.clients.post("kv/range", {"key": encode(leader_key)}).get("kvs", [])
        return bool(found) and decode(found[0].get("value", "")) == me

    def write(self, changes: Sequence[Change], events: Sequence[EventRecord] = ()) -> None:
        # etcd refuses a transaction naming a key twice; several operations written together
        # (``journal.py``) may change one row twice: the last change of each key is the one.
        operations: dict[str, dict[str, Any]] = {}
        for change in changes:
            key = encode(self.key(change.table.value, *change.key))
            if isinstance(change, Delete):
                operations[key] = {"request_delete_range": {"key": key}}
            else:
                operations[key] = {"request_put": {"key": key, "value": encode(json.dumps(change.values))}}
        for e in events:  # an event's key is created once, never overwritten
            key = encode(self._event_key(e.id))
            operations[key] = {"request_put": {"key": key, "value": encode(json.dumps(e.as_dict()))}}
        if operations:
            self._txn(list(operations.values()), absent=[self._event_key(e.id) for e in events])

    # ------------------------------------------------------------ the event log
    def _event_key(self, event_id: int) -> str:
        return self.key("events", f"{event_id:0{EVENT_DIGITS}d}")

    def _last_event_id(self) -> int:
        prefix = self.key("events") + "/"
        newest = self._range(prefix, _end_of(prefix), limit=1, descending=True)
        return int(newest[0][1]["id"]) if newest else 0

    def _scan(self, since_id: int, descending: bool) -> Iterator[EventRecord]:
        """Events after ``since_id``, a page at a time, oldest (or newest) first."""
        start, end = self._event_key(since_id + 1), _end_of(self.key("events") + "/")
        while True:
            page = self._range(start, end, limit=PAGE, descending=descending)
            yield from (EventRecord.of(value) for _, value in page)
            if len(page) < PAGE:
                return
            if descending:
                end = page[-1][0]
            else:
                start = page[-1][0] + "\0"

    def events(
        self, since_id: int, task: str | None, limit: int, kinds: frozenset[str], newest: bool
    ) -> list[EventRecord]:
        found: list[EventRecord] = []
        for event in self._scan(since_id, descending=newest):
            if (task is None or event.task == task) and (not kinds or event.kind in kinds):
                found.append(event)
                if len(found) >= limit:
                    break
        return found[::-1] if newest else found

    def close(self) -> None:
        for client in self.clients.clients:
            client.session.close()

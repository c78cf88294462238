"""Values in a task's rendezvous store, signed so that workers can tell the coordinator's (and
their peers') writes from anyone else's.

torch's TCPStore has no authentication: whoever reaches its port can write any key. The
coordinator gives each task's workers a key of their own (derived from the cluster secret, in
their environment); every value that steers them (a membership, a spare's identity, a
newcomer's readiness) is ``<hmac>.<payload>``, the HMAC-SHA256 of the store key's name and the
payload. Binding the name stops a genuine value from being replayed under another key (an old
generation's membership as a newer one's).
"""

from __future__ import annotations

import hashlib
import hmac


def derive(secret: bytes, task: str) -> str:
    """The task's store key (hex), derived from the cluster secret: the same after a restart."""
    return hmac.new(secret, b"rendezvous/" + task.encode(), hashlib.sha256).hexdigest()


def _mac(key: str, name: str, payload: str) -> str:
    return hmac.new(bytes.fromhex(key), f"{name}\n{payload}".encode(), hashlib.sha256).hexdigest()


def sign(key: str, name: str, payload: str) -> str:
    """``payload`` to be stored under ``name``, signed."""
    return f"{_mac(key, name, payload)}.{payload}"


def opened(key: str, name: str, value: bytes | str) -> str | None:
    """The payload of a value stored under ``name`` if ``key`` signed it for that name; None for
    an unsigned, forged, altered or moved one."""
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    mac, dot, payload = text.partition(".")
    if not dot or not hmac.compare_digest(mac, _mac(key, name, payload)):
        return None
    return payload

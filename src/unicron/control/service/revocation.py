"""Revoked tokens: one token taken back before it expires (a leaked agent token, a person who
left), without rotating the cluster secret and re-issuing every other token.

`unicron token revoke` appends the token's id (its ``jti``) to ``revoked-tokens`` in the
coordinator's state directory (mode 0600, one JSON object a line: the id, its role and subject
when known, and when it was revoked). The coordinator looks at the file's size and mtime on each
call (at most four times a second) and reads it again when they change, so a revocation takes
effect within a quarter of a second, without a restart. The list only grows; rotating the secret
(which revokes every token) is the time to delete it.

With several coordinators (etcd), revoke through the API instead (`unicron token revoke
--coordinator A,B`): the leader keeps the id in the store, and every coordinator that leads
after it refuses the token too (``Guard``'s ``also_revoked``).
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path

from unicron.control.private import private_file
from unicron.core.access import check_token_id
from unicron.core.errors import UsageError

REVOKED_FILE = "revoked-tokens"


def revoked_path(state_dir: Path) -> Path:
    return state_dir / REVOKED_FILE


def revoke(state_dir: Path, record: dict[str, str]) -> None:
    """Add a token (``record["jti"]``, with its role and subject if known) to the revoked ones."""
    check_token_id(record["jti"])
    path = revoked_path(state_dir)
    if not state_dir.is_dir():
        raise UsageError(f"no coordinator state directory at {state_dir}: pass the coordinator's --state-dir")
    line = json.dumps({**record, "revoked_at": round(time.time(), 3)}) + "\n"
    private_file(path)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, stat.S_IRUSR | stat.S_IWUSR)
    with os.fdopen(fd, "r+b") as out:
        end = out.seek(0, os.SEEK_END)
        if end and os.pread(fd, 1, end - 1) != b"\n":
            line = "\n" + line  # a line left unfinished (a writer that died) must not swallow this one
        out.write(line.encode())


class Revocations:
    """The ids of revoked tokens, read again whenever the file changes (looked at no more often
    than every ``LOOK_EVERY_S``: thousands of agents' calls a second each asking would cost a
    file system call per call)."""

    LOOK_EVERY_S = 0.25

    def __init__(self, state_dir: Path, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = revoked_path(state_dir)
        self.clock = clock
        self._seen: tuple[int, int] | None = None  # (size, mtime_ns) of the file last read
        self._looked: float | None = None
        self._ids: frozenset[str] = frozenset()

    def ids(self) -> frozenset[str]:
        now = self.clock()
        if self._looked is not None and now - self._looked < self.LOOK_EVERY_S:
            return self._ids
        self._looked = now
        try:
            info = self.path.stat()
        except FileNotFoundError:
            self._seen, self._ids = None, frozenset()
            return self._ids
        if (info.st_size, info.st_mtime_ns) != self._seen:
            self._ids = frozenset(_ids_in(self.path.read_text(errors="replace")))
            self._seen = (info.st_size, info.st_mtime_ns)
        return self._ids


def _ids_in(text: str) -> list[str]:
    """The ids on the file's lines; a line that is not a record (a torn last line) is skipped."""
    ids = []
    for line in text.splitlines():
        try:
            jti = json.loads(line).get("jti")
        except (ValueError, AttributeError):
            continue
        if isinstance(jti, str):
            ids.append(jti)
    return ids

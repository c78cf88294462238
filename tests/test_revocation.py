"""Revoked token ids (control/service/revocation.py, tokens.verify): pure checks with a real file."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import jwt

from unicron.control.service.guard import Guard
from unicron.control.service.revocation import Revocations, revoke, revoked_path
from unicron.control.service.tokens import issue, token_id, verify
from unicron.core.access import Principal, Role

SECRET = b"0" * 64


def test_a_revoked_id_is_refused_and_the_file_is_read_again_when_it_changes(tmp_path: Path) -> None:
    first, second = issue(SECRET, Role.VIEWER, "a"), issue(SECRET, Role.VIEWER, "b")
    ticks = iter(range(1000))  # a clock that moves on at every look
    revocations = Revocations(tmp_path, clock=lambda: float(next(ticks)))
    assert revocations.ids() == frozenset()
    revoke(tmp_path, token_id(SECRET, first))
    assert verify(SECRET, first, revocations.ids()) is None
    assert verify(SECRET, second, revocations.ids()) is not None
    assert stat.S_IMODE(os.stat(revoked_path(tmp_path)).st_mode) == 0o600
    with revoked_path(tmp_path).open("a") as out:
        out.write('{"jti": "torn')  # a line being written: skipped, the others kept
    assert verify(SECRET, first, revocations.ids()) is None
    revoke(tmp_path, token_id(SECRET, second))
    assert verify(SECRET, second, revocations.ids()) is None


def test_the_guard_keeps_a_checked_token_but_still_honours_its_revocation_and_expiry(tmp_path: Path) -> None:
    now = [time.time()]
    guard = Guard(SECRET, Revocations(tmp_path, clock=lambda: now[0]), clock=lambda: now[0])
    token = jwt.encode(
        {"role": "agent", "sub": "n1", "jti": "a" * 32, "exp": int(now[0]) + 60}, SECRET, algorithm="HS256"
    )
    assert guard.token(token) == Principal(Role.AGENT, "n1")
    assert guard.token("garbage") is None and "garbage" not in guard._checked
    revoke(tmp_path, {"jti": "a" * 32, "role": "agent", "sub": "n1"})
    assert guard.token(token) is not None  # the list was looked at a moment ago
    now[0] += Revocations.LOOK_EVERY_S
    assert guard.token(token) is None  # revoked after it was kept: refused once the list is read
    other = issue(SECRET, Role.AGENT, "n2", ttl_s=60)
    assert guard.token(other) == Principal(Role.AGENT, "n2")
    now[0] += 61  # the guard's clock (PyJWT checked the expiry once, with its own)
    assert guard.token(other) is None  # expired while kept

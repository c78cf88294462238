"""Revoked token ids (control/revocation.py, tokens.verify): pure checks with a real file."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from unicron.control.revocation import Revocations, revoke, revoked_path
from unicron.control.tokens import issue, token_id, verify
from unicron.core.access import Role

SECRET = b"0" * 64


def test_a_revoked_id_is_refused_and_the_file_is_read_again_when_it_changes(tmp_path: Path) -> None:
    first, second = issue(SECRET, Role.VIEWER, "a"), issue(SECRET, Role.VIEWER, "b")
    revocations = Revocations(tmp_path)
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

"""The coordinator's state is its owner's alone (issue 53 point 5): the state directory is created
0700; the cluster secret, the store's files (SQLite and its -wal and -shm), revoked tokens, token
files and logs 0600; a state directory open to others is refused, naming it and the fix."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from unicron.control.coordinator import CoordinatorSettings
from unicron.control.private import private_log
from unicron.control.service.credentials import write_token
from unicron.control.service.revocation import revoke
from unicron.control.service.service import create_app
from unicron.control.service.tokens import issue
from unicron.control.store.secret import load_or_create_secret
from unicron.core.access import Role
from unicron.core.errors import UsageError

TASK = "{name: t, weight: 1, run: {program: [python, x.py], iterations: 5}}"


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_state_is_created_private(tmp_path: Path) -> None:
    state = tmp_path / "deep" / "state"
    admin = {"authorization": f"Bearer {issue(load_or_create_secret(state), Role.ADMIN, 'ops')}"}
    settings = CoordinatorSettings(state_dir=state, checkpoint_root=tmp_path / "ckpt")
    with TestClient(create_app(settings), headers=admin) as client:
        assert client.post("/v1/tasks", content=TASK).status_code == 201
        revoke(state, {"jti": "0" * 32})
        files = {p.name: mode(p) for p in state.iterdir()}
    assert mode(state) == 0o700
    assert {"cluster-secret", "unicron.sqlite", "unicron.sqlite-wal", "revoked-tokens"} <= set(files)
    assert set(files.values()) == {0o600}, files


def test_a_state_directory_open_to_others_is_refused_with_the_fix(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    state.chmod(0o755)
    with pytest.raises(
        UsageError, match=f"state directory {state} is open to other users .*chmod 700 {state}"
    ):
        load_or_create_secret(state)
    settings = CoordinatorSettings(state_dir=state, checkpoint_root=tmp_path / "ckpt")
    with pytest.raises(UsageError, match=f"chmod 700 {state}"):
        create_app(settings)
    assert not (state / "cluster-secret").exists()
    state.chmod(0o700)
    assert load_or_create_secret(state)  # the fix, as said


def test_a_store_left_readable_by_an_older_version_is_made_private(tmp_path: Path) -> None:
    state = tmp_path / "state"
    load_or_create_secret(state)
    for name in ("unicron.sqlite", "unicron.sqlite-wal", "unicron.sqlite-shm"):
        (state / name).touch(mode=0o644)
        (state / name).chmod(0o644)
    settings = CoordinatorSettings(state_dir=state, checkpoint_root=tmp_path / "ckpt")
    with TestClient(create_app(settings)):
        assert {mode(state / n) for n in ("unicron.sqlite", "unicron.sqlite-wal", "unicron.sqlite-shm")} == {
            0o600
        }


def test_tokens_and_logs_are_written_private(tmp_path: Path) -> None:
    token = tmp_path / "tokens" / "n0.token"
    write_token(token, "x")
    assert (mode(token.parent), mode(token)) == (0o700, 0o600)
    log = tmp_path / "logs" / "worker.log"
    with private_log(log) as out:
        out.write(b"a line\n")
    assert (mode(log.parent), mode(log)) == (0o700, 0o600)
    log.chmod(0o644)
    with private_log(log) as out:  # one made by an older version
        out.write(b"another\n")
    assert mode(log) == 0o600 and log.read_bytes() == b"a line\nanother\n"

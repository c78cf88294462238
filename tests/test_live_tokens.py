"""Revoking one token, through a real coordinator process and the CLI an operator uses: the
revoked token is refused once the coordinator next reads the list (it looks four times a second),
every other token still works, and no restart is needed (control/service/revocation.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from unicron.control.launch.localcluster import LocalCluster
from unicron.control.service.revocation import Revocations

from .test_live_cluster import without_tokens


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "unicron.cli.main", "token", *args],
        capture_output=True,
        text=True,
        env=without_tokens(),
        timeout=60,
    )


@pytest.mark.timeout(180)
def test_a_revoked_token_is_refused_and_the_others_still_work(tmp_path: Path) -> None:
    with LocalCluster(tmp_path / "cluster", nodes=1, slots=1) as cluster:
        state = str(cluster.root / "coordinator")
        alice = tmp_path / "alice.token"
        made = cli(
            "create", "--state-dir", state, "--role", "viewer", "--subject", "alice", "--output", str(alice)
        )
        assert made.returncode == 0, made.stderr
        printed = cli("create", "--state-dir", state, "--role", "viewer", "--subject", "bob")
        assert printed.returncode == 0, printed.stderr
        bob, bob_id = printed.stdout.strip(), printed.stderr.split("token id ")[1].split()[0]

        def status(token: str) -> int:
            headers = {"Authorization": f"Bearer {token}"}
            return httpx.get(f"{cluster.url}/v1/tasks", headers=headers, timeout=10).status_code

        assert status(alice.read_text().strip()) == 200 and status(bob) == 200

        revoked = cli("revoke", "--state-dir", state, "--token-file", str(alice))
        assert revoked.returncode == 0, revoked.stderr
        # The coordinator looks at the list every LOOK_EVERY_S (a quarter of a second): refused
        # from its next look on, with no restart.
        refused = lambda: status(alice.read_text().strip()) == 401  # noqa: E731
        cluster.wait(refused, 10, f"the revocation to be read (looked at every {Revocations.LOOK_EVERY_S} s)")
        assert status(bob) == 200 and cluster.get("/v1/tasks") == []  # others unaffected

        # Through the API (the way with several coordinators): kept in the store, at once.
        admin = ["--coordinator", cluster.url, "--admin-token-file", str(cluster.admin_token)]
        through_api = cli("revoke", "--id", bob_id, *admin)
        assert through_api.returncode == 0, through_api.stderr
        assert status(bob) == 401
        assert bob_id not in Revocations(cluster.root / "coordinator").ids()  # not the file's
        assert cli("revoke", "--id", "zz", *admin).returncode == 2  # names the fix, no traceback
        assert [n["state"] for n in cluster.get("/v1/nodes")] == ["healthy"]  # the agent's token too


def test_revoking_needs_one_token_named_and_says_how(tmp_path: Path) -> None:
    state = tmp_path / "coordinator"
    state.mkdir()
    neither = cli("revoke", "--state-dir", str(state))
    assert neither.returncode != 0 and "--token-file FILE or --id ID" in neither.stderr + neither.stdout
    assert "Traceback" not in neither.stderr
    bad = cli("revoke", "--state-dir", str(state), "--id", "../etc")
    assert bad.returncode != 0 and "is not a token id" in bad.stderr + bad.stdout
    assert not (state / "revoked-tokens").exists()

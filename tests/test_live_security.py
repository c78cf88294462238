"""The control plane over TLS with tokens, through real processes: a coordinator serving HTTPS
with a self-signed CA's certificate, agents with their own node's token and the CA, a task that
trains to the end; an anonymous submission (the probe ran `sh -c id` as root on an agent that
way) is refused and its program never runs; a client that does not trust the CA is refused.
(A membership forged in a task's store: ignored by the workers' signature check, as
tests/test_task_store.py::test_forged_replayed_and_unsigned_values_are_ignored shows on a real
store.)"""

from __future__ import annotations

import ssl
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trustme

from unicron.control.launch.localcluster import LocalCluster, TlsFiles
from unicron.core.access import Role

from .test_live_cluster import task_yaml, without_tokens


def self_signed(directory: Path) -> TlsFiles:
    """A throwaway CA and a certificate for 127.0.0.1 signed by it (PEM files)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    issued = ca.issue_cert("127.0.0.1", "localhost")
    files = TlsFiles(directory / "cert.pem", directory / "key.pem", directory / "ca.pem")
    issued.cert_chain_pems[0].write_to_path(str(files.cert))
    issued.private_key_pem.write_to_path(str(files.key))
    ca.cert_pem.write_to_path(str(files.ca))
    return files


@pytest.mark.timeout(300)
def test_tls_and_tokens_end_to_end(tmp_path: Path) -> None:
    tls = self_signed(tmp_path / "tls")
    marker = tmp_path / "pwned"
    intruder = f"name: intruder\nweight: 1\nthroughput: {{1: 1.0e9}}\nrun: {{program: [touch, {marker}]}}\n"
    with LocalCluster(tmp_path / "cluster", nodes=1, slots=2, tls=tls) as cluster:
        assert cluster.url.startswith("https://")
        with httpx.Client(verify=ssl.create_default_context(cafile=str(tls.ca))) as anonymous:
            refused = anonymous.post(f"{cluster.url}/v1/tasks", content=intruder)
        assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            httpx.get(f"{cluster.url}/health", headers=cluster.credentials.headers)
        cluster.submit(task_yaml("lm", 1, "{2: 1.9e9}", 12, 0.0))
        # `unicron logs --follow` (a viewer's token) from rank 0's start: it ends by itself when
        # the worker exits, having printed all it wrote (read by its agent, relayed over TLS).
        cluster.wait(lambda: any(w["task"] == "lm" for w in cluster.get("/v1/workers")), 120, "workers")
        reader = [*logs_cli(cluster, tls.ca), "lm"]
        following = subprocess.Popen(
            [*reader, "--follow"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=without_tokens(),
        )
        cluster.wait(lambda: cluster.task("lm")["state"] == "finished", 240, "the task to finish over TLS")
        followed, follow_errors = following.communicate(timeout=60)
        last = subprocess.run(
            [*reader, "--tail", "1"], capture_output=True, text=True, timeout=60, env=without_tokens()
        )
        wrong = subprocess.run(
            [*reader, "--rank", "7"], capture_output=True, text=True, timeout=60, env=without_tokens()
        )
        names = [t["name"] for t in cluster.get("/v1/tasks")]
        cli = [sys.executable, "-m", "unicron.cli.main", "status", "--coordinator", cluster.url]
        trusted = [*cli, "--token-file", str(cluster.admin_token), "--ca", str(tls.ca)]
        shown = subprocess.run(trusted, capture_output=True, text=True, timeout=60, env=without_tokens())
        untrusting = subprocess.run(
            [*cli, "--token-file", str(cluster.admin_token)],
            capture_output=True,
            text=True,
            timeout=60,
            env=without_tokens(),
        )
    assert names == ["lm"] and not marker.exists()
    assert shown.returncode == 0 and "lm" in shown.stdout and "finished" in shown.stdout, shown.stderr
    assert untrusting.returncode == 2 and "CERTIFICATE_VERIFY_FAILED" in untrusting.stderr
    assert following.returncode == 0 and "finished step 12, parameters" in followed, follow_errors
    assert last.returncode == 0 and last.stdout.startswith("finished step 12, parameters"), last.stderr
    assert len(last.stdout.splitlines()) == 1
    assert wrong.returncode == 2 and "no rank 7" in wrong.stderr and "--rank" in wrong.stderr, wrong.stderr


def logs_cli(cluster: LocalCluster, ca: Path) -> list[str]:
    """`unicron logs` against ``cluster`` with a viewer's token: reading logs is reading."""
    viewer = cluster.token_file(Role.VIEWER, "reader")
    cli = [sys.executable, "-m", "unicron.cli.main", "logs", "--coordinator", cluster.url]
    return [*cli, "--token-file", str(viewer), "--ca", str(ca)]

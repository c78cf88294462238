"""Unicron under a real Slurm (issue 15): deploy/slurm/unicron.sbatch submitted with sbatch to a
slurmctld with three slurmds, each on a test host of its own. The batch script's one command
(`unicron slurm run`) starts the coordinator on the first node and an agent on every node with
srun, submits the tinygpt task, follows it to its end and stops. Skipped, with the reason, where
Slurm or network namespaces are missing (`make test` installs slurm-wlm and munge as root).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from unicron.control.launch.slurm import Allocation, allocation_from, parse_node_addresses
from unicron.control.launch.slurmjob import RESTARTS, Layout, Supervisor
from unicron.control.launch.testhosts import TestHosts
from unicron.control.launch.testhosts import unavailable as hosts_unavailable
from unicron.core.errors import UsageError

from .conftest import ROOT
from .slurmharness import SlurmCluster
from .slurmharness import unavailable as slurm_unavailable
from .test_live_cluster import alive, assert_ends_exact, assert_ledger_exact, read_trace, traced_task

SCONTROL_NODES = (
    "NodeName=n1 Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 NodeAddr=10.231.0.11 NodeHostName=n1 State=IDLE\n"
    "NodeName=n2 Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 NodeAddr=gpu-017 NodeHostName=n2 State=IDLE\n"
)


def allocation(env: dict[str, str]) -> Allocation:
    return allocation_from(
        env,
        lambda nodes: {"n[1-2]": ["n1", "n2"]}[nodes],
        lambda nodes: parse_node_addresses(SCONTROL_NODES),
        lambda name: {"gpu-017": "10.0.0.17"}.get(name, name),
    )


def test_the_allocation_is_read_from_slurms_variables_and_node_addresses() -> None:
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "n[1-2]", "SLURMD_NODENAME": "n2"}
    job = allocation(env)
    assert (job.head, job.here, job.is_head) == ("n1", "n2", False)
    assert dict(job.addresses) == {"n1": "10.231.0.11", "n2": "10.0.0.17"}  # a NodeAddr name resolved
    with pytest.raises(UsageError, match=r"sbatch deploy/slurm/unicron\.sbatch"):
        allocation({"SLURMD_NODENAME": "n1"})
    with pytest.raises(UsageError, match="not in the job's nodes"):
        allocation({**env, "SLURMD_NODENAME": "login1"})


def test_slurm_run_outside_an_allocation_says_how_to_submit_it(tmp_path: Path) -> None:
    spec = tmp_path / "task.yaml"
    spec.write_text(traced_task(tmp_path / "trace.jsonl", "{1: 1.0e9}", 10, 0.0))
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nweight: -1\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    done = subprocess.run(
        [sys.executable, "-m", "unicron.cli.main", "slurm", "run", str(spec)],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert done.returncode == 2 and "sbatch deploy/slurm/unicron.sbatch" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    refused = subprocess.run(
        [sys.executable, "-m", "unicron.cli.main", "slurm", "run", str(bad)],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert refused.returncode == 2 and "weight" in refused.stderr and "Traceback" not in refused.stderr


REASON = hosts_unavailable() or slurm_unavailable()


@pytest.mark.skipif(REASON is not None, reason=f"no Slurm on test hosts here: {REASON}")
@pytest.mark.timeout(600)
def test_the_sbatch_script_runs_tinygpt_on_slurm_nodes_and_recovers_a_killed_worker(tmp_path: Path) -> None:
    """sbatch on 3 nodes: the job's coordinator and agents come up on the nodes' own addresses,
    the task trains on all three, a worker killed mid-run is recovered in place, the task ends
    with the parameters of a failure-free run and an exact ledger, and the job completes with
    exit 0 leaving no process behind. A second job on the same root finds the task done."""
    trace, iterations = tmp_path / "trace.jsonl", 40
    spec = tmp_path / "task.yaml"
    spec.write_text(traced_task(trace, "{1: 1.0e9, 2: 1.9e9, 3: 2.7e9}", iterations, 0.1))
    root = tmp_path / "cluster"
    with TestHosts(4) as hosts:
        nodes = {f"n{i}": hosts.hosts[i] for i in (1, 2, 3)}
        with SlurmCluster(hosts, tmp_path / "slurm", hosts.hosts[0], nodes) as slurm:
            slurm.env["PATH"] = f"{Path(sys.executable).parent}:{slurm.env['PATH']}"
            submit = ["sbatch", "--parsable", "--nodes=3", f"--chdir={ROOT}"]
            script = [str(ROOT / "deploy" / "slurm" / "unicron.sbatch"), "--root", str(root), str(spec)]
            submitted = slurm.run([*submit, f"--output={tmp_path / 'job.out'}", *script])
            job = submitted.strip().split(";")[0]
            api = AdminClient(hosts, root, job, nodes["n1"].address)
            try:
                wait(lambda: steps(trace) >= 8 and len(running(api)) == 3, 240, "3 workers training")
                registered = {n["name"]: n["host"] for n in api("/v1/nodes")}
                killed = next(w for w in running(api) if w["rank"] == 1)
                os.kill(killed["pid"], signal.SIGKILL)
            finally:
                api.close()
            finished = wait_for_job(slurm, job)
            # A second job on the same root follows the task from its state: it is over already.
            again = slurm.run([*submit, f"--output={tmp_path / 'again.out'}", *script])
            resumed = wait_for_job(slurm, again.strip().split(";")[0])
    said = (tmp_path / "job.out").read_text()
    assert (finished["JobState"], finished["ExitCode"]) == ("COMPLETED", "0:0"), said
    said_again = (tmp_path / "again.out").read_text()
    assert (resumed["JobState"], resumed["ExitCode"]) == ("COMPLETED", "0:0"), said_again
    assert registered == {name: host.address for name, host in nodes.items()}  # each node by its address
    rows = read_trace(trace)
    started = {r["pid"] for r in rows if r["what"] == "started"}
    assert killed["pid"] in started and len(started) == 4  # 3 + the one that replaced the killed worker
    # (and the second job trained nothing again)
    assert not any(alive(pid, trace) for pid in started)  # the job's end stopped everything
    assert_ledger_exact(rows, iterations, frozen=frozenset({killed["rank"]}), world=3)
    assert_ends_exact(tmp_path, "lm", iterations)


def wait_for_job(slurm: SlurmCluster, job: str) -> dict[str, str]:
    wait(lambda: slurm.job(job)["JobState"] in ("COMPLETED", "FAILED", "CANCELLED"), 400, f"job {job} to end")
    return slurm.job(job)


def running(api: AdminClient) -> list[dict[str, Any]]:
    return [w for w in api("/v1/workers") if w["state"] == "running"]


def steps(trace: Path) -> int:
    if not trace.exists():
        return 0
    return max((r["step"] for r in read_trace(trace) if r["what"] == "samples"), default=0)


def wait(ready: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if ready():  # type: ignore[operator]
                return
        except (httpx.HTTPError, OSError, ValueError, KeyError):
            pass
        time.sleep(0.5)
    raise TimeoutError(f"timed out waiting for {what}")


class AdminClient:
    """GETs to the job's coordinator with the admin token the batch step handed itself, from a
    thread inside the controller's host (never from the machine's own namespace)."""

    def __init__(self, hosts: TestHosts, root: Path, job: str, head: str) -> None:
        self.inside = hosts.client(hosts.hosts[0])
        self.token_file = root / "tokens" / f"admin-slurm-{job}.token"
        self.client = httpx.Client(base_url=f"http://{head}:8470", timeout=5.0)

    def __call__(self, path: str) -> Any:
        headers = {"authorization": f"Bearer {self.token_file.read_text().strip()}"}
        return self.inside.call(self.client.get, path, headers=headers).raise_for_status().json()

    def close(self) -> None:
        self.client.close()


def test_a_nodes_processes_are_restarted_a_few_times_and_stopped_by_the_stop_file(tmp_path: Path) -> None:
    count = tmp_path / "starts"
    crashing = Supervisor(
        {"agent": ["sh", "-c", f"echo x >> {count}; exit 3"], "coordinator": ["sleep", "60"]},
        Layout(tmp_path),
        tmp_path / "stop",
    )
    assert crashing.run() == 1  # an agent that keeps exiting: the node gives up
    assert len(count.read_text().split()) == 1 + RESTARTS
    assert crashing.running["coordinator"].returncode is not None  # and stops the rest
    steady = Supervisor({"agent": ["sleep", "60"]}, Layout(tmp_path), tmp_path / "stop")
    threading.Timer(1.0, (tmp_path / "stop").touch).start()
    assert steady.run() == 0  # the batch step's stop file: every process stopped, exit 0
    assert steady.running["agent"].returncode == -signal.SIGTERM

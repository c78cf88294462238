"""Unicron under a real Slurm (issue 15): deploy/slurm/unicron.sbatch submitted with sbatch to a
slurmctld with three slurmds, each on a test host of its own. The batch script's one command
(`unicron slurm run`) starts the coordinator on the first node and an agent on every node with
srun, submits the tinygpt task, follows it to its end and stops. Skipped, with the reason, where
Slurm or network namespaces are missing (`make test` installs slurm-wlm and munge as root).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from unicron.cli.slurm import job_root
from unicron.control.launch.localcluster import free_port
from unicron.control.launch.slurm import (
    CPU_SLOTS,
    Allocation,
    Slots,
    allocation_from,
    node_slots,
    parse_node_addresses,
)
from unicron.control.launch.slurmjob import RESTARTS, Coordinator, Layout, Supervisor, node_processes
from unicron.control.launch.testhosts import TestHosts
from unicron.control.launch.testhosts import unavailable as hosts_unavailable
from unicron.core.errors import UsageError

from .conftest import ROOT
from .slurmharness import SlurmCluster
from .slurmharness import unavailable as slurm_unavailable
from .test_live_cluster import (
    TRAIN,
    alive,
    assert_ends_exact,
    assert_ledger_exact,
    full_speed,
    pace,
    read_rows,
    read_trace,
    task_yaml,
    traced_task,
)

SBATCH = ROOT / "deploy" / "slurm" / "unicron.sbatch"
SINGLE_MACHINE = ROOT / "deploy" / "slurm" / "single-machine.sh"

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


def test_a_nodes_slots_are_the_gpus_slurm_gave_it_else_one_cpu_worker() -> None:
    """What ``unicron slurm node`` reads in its srun step (values as Slurm 22.05 sets them for
    ``--gpus-per-node``, seen on a live cluster) and gives its agent as --slots and --gpus."""
    granted = {"SLURM_GPUS_ON_NODE": "4", "CUDA_VISIBLE_DEVICES": "4,5,6,7", "SLURM_STEP_GPUS": "4,5,6,7"}
    assert node_slots(granted) == Slots(4, ("4", "5", "6", "7"), "SLURM_GPUS_ON_NODE=4")
    uuids = "GPU-6f1c2d3e-aaaa-bbbb-cccc-0123456789ab,MIG-GPU-6f1c/1/0"
    assert node_slots({"CUDA_VISIBLE_DEVICES": uuids}).gpus == tuple(uuids.split(","))
    assert node_slots({"SLURM_STEP_GPUS": "0,1"}) == Slots(2, (), "SLURM_STEP_GPUS=0,1")  # ids not visible
    # --slots wins; the GPU ids go with it only when there are as many
    assert node_slots(granted, given=2) == Slots(2, (), "--slots 2")
    assert node_slots({"CUDA_VISIBLE_DEVICES": "0,1"}, given=2).gpus == ("0", "1")
    # No GPU in the step: one CPU worker, said with how to ask for GPUs. SLURM_JOB_GPUS is not
    # read: in a step it is the batch node's, and an --exclusive job lists GPUs its steps lack.
    for none in (
        {},
        {"SLURM_GPUS_ON_NODE": "0", "SLURM_GPUS_PER_NODE": "0"},
        {"SLURM_JOB_GPUS": "0,1"},
        {"CUDA_VISIBLE_DEVICES": "NoDevFiles"},
        {"CUDA_VISIBLE_DEVICES": ""},
        {"CUDA_VISIBLE_DEVICES": "-1"},
    ):
        found = node_slots(none)
        assert (found.count, found.gpus) == (CPU_SLOTS, ()), none
        assert "sbatch --gpus-per-node=N" in found.source and "--slots N" in found.source
    assert str(node_slots(granted)) == "4 worker slots, GPUs 4,5,6,7, from SLURM_GPUS_ON_NODE=4"


def test_the_agent_is_started_with_its_nodes_slots_and_gpus(tmp_path: Path) -> None:
    job = Allocation("7", ("n1", "n2"), "n2", {"n1": "10.0.0.1", "n2": "10.0.0.2"})
    agent = node_processes(job, Layout(tmp_path), node_slots({"SLURM_GPUS_ON_NODE": "2",
                           "CUDA_VISIBLE_DEVICES": "0,1"}), [])["agent-n2"]  # fmt: skip
    assert agent[agent.index("--slots") + 1] == "2" and agent[agent.index("--gpus") + 1] == "0,1"
    cpu = node_processes(job, Layout(tmp_path), node_slots({}), [])["agent-n2"]
    assert cpu[cpu.index("--slots") + 1] == "1" and "--gpus" not in cpu


def test_the_jobs_root_is_absolute_and_a_relative_one_is_taken_from_the_jobs_folder(tmp_path: Path) -> None:
    assert job_root(None, "42", tmp_path) == tmp_path / ".unicron" / "slurm-42"
    assert job_root(Path("shared/run"), "42", tmp_path) == tmp_path / "shared" / "run"
    assert job_root(Path("../run"), "42", tmp_path / "sub") == tmp_path / "run"
    assert job_root(Path("/scratch/u/run"), "42", tmp_path) == Path("/scratch/u/run")
    assert job_root(Path("~/run"), "42", tmp_path) == Path.home() / "run"


def test_the_batch_step_submits_the_task_files_paths_made_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The batch step runs in the job's folder, not the task file's: the program named relative
    to the task file is sent absolute, as `unicron submit` sends it."""
    folder = tmp_path / "task"
    folder.mkdir()
    (folder / "train.py").write_text("")
    (folder / "task.yaml").write_text(
        "name: lm\nweight: 1\nthroughput: {1: 1.0e9}\nrun:\n  program: [python, train.py]\n  iterations: 5\n"
    )
    elsewhere = tmp_path / "job"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    posted: list[bytes] = []

    def coordinator(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            posted.append(request.content)
            return httpx.Response(201, json=[{"name": "lm"}])
        return httpx.Response(200, json=[])

    api = Coordinator("http://head:8470", "token")
    api.client = httpx.Client(base_url=api.url, transport=httpx.MockTransport(coordinator))
    assert api.submit(Path("../task/task.yaml")) == ["lm"]
    assert f"- {folder / 'train.py'}" in posted[0].decode()


def test_the_sbatch_script_asks_for_whole_nodes_with_their_gpus_and_the_recipe_script_parses() -> None:
    directives = [line.split()[1] for line in SBATCH.read_text().splitlines() if line.startswith("#SBATCH")]
    assert {"--gpus-per-node=8", "--exclusive", "--mem=0", "--no-kill", "--ntasks-per-node=1"} <= set(
        directives
    )
    for script in (SBATCH, SINGLE_MACHINE):
        assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0, script
        assert os.access(script, os.X_OK), f"{script} is not executable"


def test_slurm_run_outside_an_allocation_says_how_to_submit_it(tmp_path: Path) -> None:
    spec = tmp_path / "task.yaml"
    spec.write_text(task_yaml("lm", 1, "{1: 1.0e9}", 10, 0.0))  # never run: compared with nothing
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
    """sbatch on 3 nodes with a GPU each (stand-ins), from a folder that is neither the
    repository's nor the task file's, the task file, its program and the root all given relative:
    the job's coordinator and agents come up on the nodes' own addresses, each agent with the GPU
    Slurm gave its node, the task trains on all three, a worker killed mid-run is recovered in
    place, the task ends with the parameters of a failure-free run and an exact ledger, and the
    job completes with exit 0 leaving no process behind, its output naming the admin token. A
    second job on the same root, asking for no GPU (one CPU slot a node), finds the task done."""
    trace, iterations = tmp_path / "trace.jsonl", 40
    folder = tmp_path / "spec"
    folder.mkdir()
    text = traced_task(trace, "{1: 1.0e9, 2: 1.9e9, 3: 2.7e9}", iterations, 0.1)
    (folder / "task.yaml").write_text(text.replace(str(TRAIN), os.path.relpath(TRAIN, folder)))
    root = tmp_path / "cluster"
    with TestHosts(4) as hosts:
        nodes = {f"n{i}": hosts.hosts[i] for i in (1, 2, 3)}
        with SlurmCluster(hosts, tmp_path / "slurm", hosts.hosts[0], nodes, gpus=1) as slurm:
            slurm.env["PATH"] = f"{Path(sys.executable).parent}:{slurm.env['PATH']}"
            submit = ["sbatch", "--parsable", "--nodes=3", f"--chdir={tmp_path}"]
            script = [str(SBATCH), "--root", "cluster", "spec/task.yaml"]
            submitted = slurm.run([*submit, "--gpus-per-node=1", f"--output={tmp_path / 'job.out'}", *script])
            job = submitted.strip().split(";")[0]
            api = AdminClient(hosts, root, job, nodes["n1"].address)
            try:
                wait(lambda: steps(trace) >= 8 and len(running(api)) == 3, 240, "3 workers training")
                pace(trace, 1.0)  # the survivors go on slowly until the killed worker's replacement runs
                registered = {n["name"]: (n["host"], n["slots"], n["gpus"]) for n in api("/v1/nodes")}
                killed = next(w for w in running(api) if w["rank"] == 1)
                os.kill(killed["pid"], signal.SIGKILL)
                wait(lambda: len(started(trace)) >= 4, 240, "a worker replacing the killed one to start")
                full_speed(trace)
            finally:
                api.close()
            finished = wait_for_job(slurm, job)
            # A second job on the same root follows the task from its state: it is over already.
            again = slurm.run([*submit, "--gpus-per-node=0", f"--output={tmp_path / 'again.out'}", *script])
            resumed = wait_for_job(slurm, again.strip().split(";")[0])
    said = (tmp_path / "job.out").read_text()
    assert (finished["JobState"], finished["ExitCode"]) == ("COMPLETED", "0:0"), said
    said_again = (tmp_path / "again.out").read_text()
    assert (resumed["JobState"], resumed["ExitCode"]) == ("COMPLETED", "0:0"), said_again
    # each node by its address, with the GPU Slurm gave it (SLURM_GPUS_ON_NODE, CUDA_VISIBLE_DEVICES)
    assert registered == {name: (host.address, 1, ["0"]) for name, host in nodes.items()}
    token = root / "tokens" / f"admin-slurm-{job}.token"
    watch = f"unicron status --coordinator http://{nodes['n1'].address}:8470 --token-file {token}"
    assert f"root {root}" in said and f"admin token {token}" in said and watch in said, said
    for name in nodes:
        assert f"{name} 1 slot (GPUs 0)" in said, said
        assert f"{name} 1 slot (no GPU named)" in said_again, said_again  # the fallback: a CPU worker
    rows = read_trace(trace)
    pids = started(trace)
    assert killed["pid"] in pids and len(pids) == 4  # 3 + the one that replaced the killed worker
    # (and the second job trained nothing again)
    assert not any(alive(pid, trace) for pid in pids)  # the job's end stopped everything
    assert_ledger_exact(rows, iterations, frozen=frozenset({killed["rank"]}), world=3)
    assert_ends_exact(tmp_path, "lm", iterations)


def wait_for_job(slurm: SlurmCluster, job: str) -> dict[str, str]:
    wait(lambda: slurm.job(job)["JobState"] in ("COMPLETED", "FAILED", "CANCELLED"), 400, f"job {job} to end")
    return slurm.job(job)


def running(api: AdminClient) -> list[dict[str, Any]]:
    return [w for w in api("/v1/workers") if w["state"] == "running"]


def started(trace: Path) -> set[int]:
    """The pids of the workers that wrote ``trace`` (each writes a row as it starts)."""
    return {r["pid"] for r in read_rows(trace) if r["what"] == "started"} if trace.exists() else set()


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


ALONE_REASON = slurm_unavailable() or (None if os.geteuid() == 0 else "not root (slurmd runs as root)")


@pytest.mark.skipif(ALONE_REASON is not None, reason=f"no single-machine Slurm here: {ALONE_REASON}")
@pytest.mark.timeout(300)
def test_the_single_machine_recipe_runs_the_example_and_unicron_status_watches_it(tmp_path: Path) -> None:
    """docs/multi-host.md's "Slurm on one machine", as written, in the machine's own namespace
    (a folder and ports of the test's own): deploy/slurm/single-machine.sh starts Slurm with two
    stand-in GPUs, the shipped sbatch script runs examples/tinygpt/task.yaml from another folder,
    the `unicron status` line the job prints shows the task on the node's 2 slots, the job
    completes, and `stop` ends the three daemons."""
    folder = tmp_path / "slurm"
    env = {
        **os.environ,
        "UNICRON_SLURM_DIR": str(folder),
        "SLURM_GPUS": "2",
        "SLURMCTLD_PORT": str(free_port()),
        "SLURMD_PORT": str(free_port()),
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",  # `unicron`, as in an active venv
    }
    work = tmp_path / "work"
    work.mkdir()
    started = subprocess.run(
        [str(SINGLE_MACHINE), "start"], env=env, capture_output=True, text=True, timeout=120
    )
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        assert f"export SLURM_CONF={folder / 'slurm.conf'}" in started.stdout, started.stdout
        assert "--gpus-per-node=2" in started.stdout
        env["SLURM_CONF"] = str(folder / "slurm.conf")
        example = ROOT / "examples" / "tinygpt" / "task.yaml"
        submit = ["sbatch", "--parsable", "--nodes=1", "--gpus-per-node=2", str(SBATCH)]
        submitted = subprocess.run(
            [*submit, "--port", str(free_port()), str(example)], env=env, cwd=work, capture_output=True,
            text=True, timeout=60, check=True,
        )  # fmt: skip
        job = submitted.stdout.strip().split(";")[0]
        out = work / f"unicron-{job}.out"

        def state() -> str:
            shown = subprocess.run(
                ["scontrol", "show", "job", "-o", job], env=env, capture_output=True, text=True
            )
            return " ".join(w for w in shown.stdout.split() if w.startswith(("JobState=", "ExitCode=")))

        seen = ""  # what the `unicron status` line the job printed shows, run as printed
        while "tinygpt" not in seen and not state().startswith(("JobState=COMPLETED", "JobState=FAILED")):
            said = out.read_text() if out.exists() else ""
            watch = next((line for line in said.splitlines() if "unicron status" in line), None)
            if watch is not None:
                argv = watch[watch.index("unicron status") :].split()
                shown = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
                seen = shown.stdout if shown.returncode == 0 else ""
            time.sleep(0.3)
        wait(lambda: state().startswith(("JobState=COMPLETED", "JobState=FAILED")), 240, f"job {job} to end")
        finished = state()
    finally:
        stopped = subprocess.run(
            [str(SINGLE_MACHINE), "stop"], env=env, capture_output=True, text=True, timeout=120
        )
    said = out.read_text()
    assert finished == "JobState=COMPLETED ExitCode=0:0", said
    assert f"{socket.gethostname().split('.')[0]} 2 slots (GPUs 0,1)" in said, said
    assert "tinygpt: finished at step 60" in said and "every task finished" in said, said
    assert "tinygpt" in seen, f"`unicron status` never showed the task while the job ran: {said}"
    assert stopped.returncode == 0, stopped.stderr
    for daemon in ("slurmd", "slurmctld", "munged"):
        assert f"{daemon} stopped" in stopped.stdout, stopped.stdout

"""Unicron inside a Slurm allocation: the coordinator on the head node, an agent on every node.

``unicron slurm run TASK.yaml`` is the batch script's one command. It runs on the head node (the
allocation's first, where Slurm runs batch scripts), and:

1. makes the cluster secret and hands out the tokens (an agent token per node, an admin token
   for itself, ``ROOT/tokens/admin-slurm-JOBID.token``) as files under the shared root, mode
   0600: agents never read the secret. The job's output names the admin token and the
   ``unicron status`` line that watches the job with it;
2. starts one job step, ``srun --ntasks-per-node=1 unicron slurm node``, which runs the
   coordinator on the head and an agent on every node, each bound to its node's ``NodeAddr``,
   with the slots and GPUs Slurm gave that node (``node_slots``).
   The step is started with ``--kill-on-bad-exit=0`` and the job should ask for ``--no-kill``:
   a node that fails must not end the allocation, since Unicron's answer to it is to re-plan;
3. waits for every node's agent, submits the tasks, waits until each has ended (finished,
   failed or cancelled), and ends the step. Its exit code is 0 when every task finished.

The root (``--root``) must be on storage every node shares: it holds the coordinator's state,
the checkpoints (the one path shared by design), the tokens and the logs. A job given the root of
an earlier one continues from its state.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from unicron.control.agent.processes import dies_with_parent
from unicron.control.launch.slurm import Allocation, Slots
from unicron.control.launch.taskfile import read_task_file
from unicron.control.private import private_log
from unicron.control.service.credentials import Credentials, read_token, write_token
from unicron.control.service.tokens import issue
from unicron.control.store.secret import load_or_create_secret
from unicron.core.access import Role
from unicron.core.errors import UnicronError
from unicron.core.states import TaskState

ENDED = {TaskState.FINISHED.value, TaskState.FAILED.value, TaskState.CANCELLED.value}
RESTARTS = 5  # a node's coordinator or agent that exits by itself is started again this often
GRACE_S = 15.0  # from SIGTERM to SIGKILL when the step ends


@dataclass(frozen=True)
class Layout:
    """Where a job's files live under the shared root, and the coordinator's port."""

    root: Path
    port: int = 8470

    @property
    def state_dir(self) -> Path:
        return self.root / "coordinator"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    def token(self, role: Role, subject: str) -> Path:
        return self.root / "tokens" / f"{role.value}-{subject}.token"

    def stop_file(self, job_id: str) -> Path:
        """Written by the batch step when the tasks have ended: every node stops its processes."""
        return self.root / f"stop-{job_id}"

    def log(self, name: str) -> Path:
        return self.root / "logs" / f"{name}.log"

    def url(self, allocation: Allocation) -> str:
        return f"http://{allocation.address(allocation.head)}:{self.port}"


def say(line: str) -> None:
    print(f"unicron slurm: {line}", flush=True)


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "unicron.cli.main", *args]


def hand_out_tokens(allocation: Allocation, layout: Layout) -> Path:
    """The secret (made once; a root reused by a later job keeps its own) and the tokens: one
    per node's agent, one admin token for the batch step. Returns the admin token's file."""
    secret = load_or_create_secret(layout.state_dir)
    (layout.root / "tokens").mkdir(parents=True, exist_ok=True, mode=0o700)
    for node in allocation.nodes:
        write_token(layout.token(Role.AGENT, node), issue(secret, Role.AGENT, node))
    admin = layout.token(Role.ADMIN, f"slurm-{allocation.job_id}")
    write_token(admin, issue(secret, Role.ADMIN, f"slurm-{allocation.job_id}"))
    return admin


# ---------------------------------------------------------------------- one node (srun's task)
def node_processes(
    allocation: Allocation, layout: Layout, slots: Slots, coordinator_args: list[str]
) -> dict[str, list[str]]:
    """What runs on this node: the coordinator (head only) and the agent (its slots and GPUs as
    :func:`~unicron.control.launch.slurm.node_slots` read them), as command lines."""
    here = allocation.address(allocation.here)
    commands: dict[str, list[str]] = {}
    if allocation.is_head:
        commands["coordinator"] = _cli(
            "coordinator", "--host", here, "--advertise", here, "--port", str(layout.port),
            "--state-dir", str(layout.state_dir), "--checkpoint-dir", str(layout.checkpoints),
            *coordinator_args,
        )  # fmt: skip
    commands[f"agent-{allocation.here}"] = _cli(
        "agent", "--coordinator", layout.url(allocation), "--node", allocation.here,
        "--slots", str(slots.count), "--address", here,
        "--run-dir", str(layout.root / "agents" / allocation.here),
        "--token-file", str(layout.token(Role.AGENT, allocation.here)),
        *(["--gpus", ",".join(slots.gpus)] if slots.gpus else []),
    )  # fmt: skip
    return commands


class Supervisor:
    """Keeps this node's processes running until SIGTERM (the step ends), restarting one that
    exits by itself (a crashed coordinator continues from its durable state) a few times."""

    def __init__(self, commands: dict[str, list[str]], layout: Layout, stop_file: Path) -> None:
        self.commands, self.layout, self.stop_file = commands, layout, stop_file
        self.running: dict[str, subprocess.Popen[bytes]] = {}
        self.restarts = 0
        self.stopping = False

    def start(self, name: str) -> None:
        with private_log(self.layout.log(name)) as out:
            self.running[name] = subprocess.Popen(
                self.commands[name],
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=dies_with_parent(signal.SIGTERM),  # the step ends: its processes stop
            )

    def run(self) -> int:
        """Until the stop file appears or a signal comes: 0; or 1 when a process keeps exiting."""
        handlers = {sig: signal.signal(sig, self._told_to_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            for name in self.commands:
                self.start(name)
            while not self.stopping and not self.stop_file.exists():
                if not self._restart_exited():
                    return 1
                time.sleep(0.5)
            return 0
        finally:
            self.stop()
            for sig, handler in handlers.items():
                signal.signal(sig, handler)

    def _told_to_stop(self, *_: object) -> None:
        self.stopping = True

    def _restart_exited(self) -> bool:
        """Start again each process that exited; False once the restarts are spent."""
        for name, process in list(self.running.items()):
            code = process.poll()
            if code is None:
                continue
            if self.restarts >= RESTARTS:
                say(f"{name} exited ({code}) after {RESTARTS} restarts: giving up on this node")
                return False
            self.restarts += 1
            say(f"{name} exited ({code}); starting it again (log {self.layout.log(name)})")
            self.start(name)
        return True

    def stop(self) -> None:
        began = time.monotonic()
        for process in self.running.values():
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
        for name, process in self.running.items():
            try:
                process.wait(max(0.1, began + GRACE_S - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            say(f"{name} stopped ({process.returncode}) {time.monotonic() - began:.1f} s after the stop")


# ---------------------------------------------------------------------- the batch step
class Coordinator:
    """The batch step's calls to the coordinator (admin token)."""

    def __init__(self, url: str, token: str) -> None:
        self.url = url
        self.client = httpx.Client(base_url=url, timeout=10.0, headers=Credentials(token).headers)

    def get(self, path: str) -> Any:
        response = self.client.get(path)
        response.raise_for_status()
        return response.json()

    def events_after(self, cursor: int) -> tuple[list[dict[str, Any]], int]:
        """Every event after id ``cursor`` (page by page: the API returns at most a page), and
        the id to ask after next time."""
        found: list[dict[str, Any]] = []
        while page := self.get(f"/v1/events?since={cursor}"):
            found += page
            cursor = page[-1]["id"]
        return found, cursor

    def submit(self, spec: Path) -> list[str]:
        """Submit the tasks of ``spec``; a task the coordinator has already (the root of an
        earlier job, or a requeued one) is followed, not submitted again: it goes on from its
        state and its newest checkpoint."""
        task_file = read_task_file(spec)  # its relative paths made absolute against its folder
        names = [task.name for task in task_file.specs]
        known = {task["name"] for task in self.get("/v1/tasks")}
        if set(names) <= known:
            say(f"{', '.join(names)}: known from an earlier run of this root, followed from its state")
            return names
        response = self.client.post(
            "/v1/tasks", content=task_file.text.encode(), headers={"content-type": "application/yaml"}
        )
        if response.status_code >= 400:
            raise UnicronError(f"{spec}: the coordinator refused it: {response.json().get('error')}")
        return [task["name"] for task in response.json()]

    def wait(
        self, ready: Callable[[], bool], timeout_s: float, what: str, step: subprocess.Popen[bytes]
    ) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if step.poll() is not None:
                raise UnicronError(f"the job step ended ({step.returncode}) while waiting for {what}")
            with contextlib.suppress(httpx.HTTPError):
                if ready():
                    return
            time.sleep(0.5)
        raise UnicronError(f"no {what} after {timeout_s:.0f} s: see the logs under the root's logs/")


def node_step(allocation: Allocation, layout: Layout, slots: int, passed: list[str]) -> list[str]:
    """The ``srun`` line that starts ``unicron slurm node`` once on every node of the job
    (``slots`` 0: each node counts its own GPUs)."""
    return [
        "srun", f"--nodes={len(allocation.nodes)}", f"--ntasks={len(allocation.nodes)}",
        "--ntasks-per-node=1", "--kill-on-bad-exit=0", "--no-kill", "--overlap",
        *_cli("slurm", "node", "--root", str(layout.root), "--port", str(layout.port), "--slots", str(slots),
              *passed),
    ]  # fmt: skip


def run_job(
    allocation: Allocation, layout: Layout, specs: list[Path], slots: int, passed: list[str], wait_s: float
) -> int:
    """Start the cluster on the allocation, run ``specs``' tasks to their end, stop. 0: all finished."""
    admin = hand_out_tokens(allocation, layout)
    token = read_token(admin)
    layout.stop_file(allocation.job_id).unlink(missing_ok=True)  # a requeued job keeps its id
    say(f"job {allocation.job_id}: coordinator on {allocation.head} ({layout.url(allocation)}), "
        f"agents on {', '.join(allocation.nodes)}; root {layout.root}")  # fmt: skip
    say(f"admin token {admin}; watch it from a machine that reaches the head and reads the root: "
        f"unicron status --coordinator {layout.url(allocation)} --token-file {admin}")  # fmt: skip
    started = time.time()
    with private_log(layout.log("step")) as out:
        step = subprocess.Popen(
            node_step(allocation, layout, slots, passed), stdout=out, stderr=subprocess.STDOUT
        )
    api = Coordinator(layout.url(allocation), token)

    def agents() -> list[dict[str, Any]]:
        """This job's agents: on its nodes, healthy, heard since the job began (a root reused
        from an earlier job holds that job's nodes, healthy, until their deadline)."""
        since = time.time() - started
        return [
            n
            for n in api.get("/v1/nodes")
            if n["name"] in allocation.nodes
            and n["state"] == "healthy"
            and n["seconds_since_heartbeat"] < since
        ]

    try:
        api.wait(lambda: api.client.get("/health").status_code == 200, wait_s, "coordinator", step)
        api.wait(lambda: len(agents()) == len(allocation.nodes), wait_s, "agent on every node", step)
        say("agents: " + "; ".join(agent_line(node) for node in agents()))
        names = [name for spec in specs for name in api.submit(spec)]
        say(f"following {', '.join(names)}")
        ended = follow(api, names, step)
    finally:
        end_step(step, layout.stop_file(allocation.job_id))
    failed = {name: state for name, state in ended.items() if state != TaskState.FINISHED.value}
    say("every task finished" if not failed else f"not finished: {failed}")
    return 0 if not failed else 1


def follow(api: Coordinator, names: list[str], step: subprocess.Popen[bytes]) -> dict[str, str]:
    """Poll the tasks until each has ended, printing each change of state and each incident with
    what was done about it; their last states."""
    seen: dict[str, str] = {}
    cursor = api.events_after(0)[1]  # an earlier job's events (a reused root) are not this job's
    while True:
        if step.poll() is not None:
            raise UnicronError(f"the job step ended ({step.returncode}) before the tasks: see logs/")
        with contextlib.suppress(httpx.HTTPError):
            for task in api.get("/v1/tasks"):
                if task["name"] in names and seen.get(task["name"]) != task["state"]:
                    seen[task["name"]] = task["state"]
                    say(f"{task['name']}: {task['state']} at step {task.get('step')}")
            events, cursor = api.events_after(cursor)
            for event in events:
                if event["kind"] == "incident":
                    say(incident_line(event))
        if len(seen) == len(names) and all(state in ENDED for state in seen.values()):
            return seen
        time.sleep(1.0)


def agent_line(node: dict[str, Any]) -> str:
    gpus = f"GPUs {','.join(node['gpus'])}" if node.get("gpus") else "no GPU named"
    return f"{node['name']} {node['slots']} slot{'s' if node['slots'] != 1 else ''} ({gpus})"


def incident_line(event: dict[str, Any]) -> str:
    detail, where = event["detail"], f" on {event['node']}" if event.get("node") else ""
    task = event.get("task") or "cluster"
    return f"incident {event['id']}: {detail['kind']}{where} ({task}): {detail['action']}"


def end_step(step: subprocess.Popen[bytes], stop_file: Path) -> None:
    """End the node step: the stop file tells every node's supervisor to stop its processes and
    exit, so that the step ends by itself; if it does not, srun is told to end it (SIGTERM)."""
    stop_file.touch()
    with contextlib.suppress(subprocess.TimeoutExpired):
        step.wait(GRACE_S * 2)
    if step.poll() is None:
        say("the node step did not end by itself: ending it through srun")
        step.send_signal(signal.SIGTERM)
        try:
            step.wait(GRACE_S * 2)
        except subprocess.TimeoutExpired:
            step.kill()
            step.wait()


def run_node(allocation: Allocation, layout: Layout, slots: Slots, coordinator_args: list[str]) -> int:
    """This node's part of the job (``unicron slurm node``, one per node under srun)."""
    commands = node_processes(allocation, layout, slots, coordinator_args)
    return Supervisor(commands, layout, layout.stop_file(allocation.job_id)).run()

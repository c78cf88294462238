"""The template server (``control/agent/template.py``): agents' fork servers forked from one
process that imported torch once, through real processes (a template that imports nothing, so
that each test costs a fork, not torch's import)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.leftovers import MARK_VARIABLE, processes_marked
from unicron.control.agent import warmstart
from unicron.control.agent.template import Template, differing
from unicron.control.agent.warmstart import Forked, WarmStarts

from .test_live_warmstart import command_of, parent_of
from .test_warmstart import BARE_PROBE, PY

# What the xdist worker's C environment may hold beside os.environ (GNU readline's), and pytest's
# name of the test under way: the template is started from this process as a cluster starts it.
IGNORED = ("COLUMNS", "LINES", "PYTEST_CURRENT_TEST")


@pytest.fixture
def template(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Template]:
    monkeypatch.setattr(warmstart, "PRELOAD", ())
    (tmp_path / "probe.py").write_text(BARE_PROBE)
    started = Template([], IGNORED)
    assert started.serving
    yield started
    started.close()


def alive(pid: int) -> bool:
    """Running (not ended, nor a zombie whose new parent has not reaped it yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def ended(pids: list[int], within_s: float = 30.0) -> bool:
    deadline = time.monotonic() + within_s
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(alive(p) for p in pids)


def test_an_environment_is_served_where_it_differs_only_in_unicrons_variables_or_those_ignored() -> None:
    own = {"PATH": "/bin", "OMP_NUM_THREADS": "4", "UNICRON_TASK": "a", "PYTEST_CURRENT_TEST": "x"}
    assert differing({**own, "UNICRON_TASK": "b", "UNICRON_RANK": "1"}, own) == []
    assert differing({**own, "PYTEST_CURRENT_TEST": "y"}, own, frozenset({"PYTEST_CURRENT_TEST"})) == []
    changed = {**own, "OMP_NUM_THREADS": "1", "TORCH_LOGS": "+dynamo"}
    del changed["PATH"]
    assert differing(changed, own) == ["OMP_NUM_THREADS", "PATH", "TORCH_LOGS"]


@pytest.mark.timeout(120)
def test_servers_are_forked_by_the_template_and_another_environment_gets_its_own(
    template: Template, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Two launches in the template's environment (one with Unicron's variables of its own) share
    a server the template forked; a launch with a variable of its own gets a server this process
    started, as without a template; each worker runs its program and its code comes back."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}

    async def scenario() -> dict[str, tuple[int, int]]:
        warm = WarmStarts(tmp_path / "servers", template=template.socket)
        seen = {}
        for name, code, extra in (
            ("a", 0, {}),
            ("a2", 3, {"UNICRON_TASK": "t"}),
            ("b", 4, {"TASK_VAR": "b"}),
        ):
            log = tmp_path / f"{name}.log"
            log.touch()
            launched = await warm.launch([PY, str(tmp_path / "probe.py"), str(code)], {**env, **extra}, log)
            assert isinstance(launched, Forked)
            returned = await launched.wait()
            # The server, as the worker read its parent (the worker may be gone before this process
            # reads its /proc entry); the server runs until ``close``.
            server = json.loads(log.read_text().splitlines()[0])["parent"]
            seen[name] = (returned, parent_of(server))
        await warm.close()
        return seen

    seen = asyncio.run(scenario())
    assert seen == {"a": (0, template.process.pid), "a2": (3, template.process.pid), "b": (4, os.getpid())}
    first = {n: json.loads((tmp_path / f"{n}.log").read_text().splitlines()[0]) for n in ("a", "a2", "b")}
    assert first["a"]["parent"] == first["a2"]["parent"] != first["b"]["parent"]
    assert first["b"]["task_var"] == "b" and first["a2"]["own_group"]
    assert "the environment differs from the template's in TASK_VAR" in capfd.readouterr().err


@pytest.mark.timeout(120)
def test_a_server_the_template_forked_and_its_worker_carry_the_runs_mark(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The end-of-run check finds what a run left behind by the mark in each process's initial
    environment (``bench/leftovers.py``). A server the template forked and a worker forked from
    it show it, under the commands they show in ps: setproctitle wrote their titles over that
    memory, and both were invisible to the check."""
    monkeypatch.setattr(warmstart, "PRELOAD", ())
    mark = f"test-{uuid.uuid4().hex}"
    monkeypatch.setenv(MARK_VARIABLE, mark)  # (the template inherits it, as a run's do)
    (tmp_path / "sleeper.py").write_text("import time\nprint('running', flush=True)\ntime.sleep(120)\n")
    started = Template([], IGNORED)

    async def scenario() -> tuple[int, int, set[int], dict[int, str]]:
        warm = WarmStarts(tmp_path / "servers", template=started.socket)
        log = tmp_path / "sleeper.log"
        log.touch()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        worker = await warm.launch([PY, str(tmp_path / "sleeper.py")], env, log)
        assert isinstance(worker, Forked)
        deadline = time.monotonic() + 60  # (its command is its own once it runs its program)
        while "running" not in log.read_text() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        server = parent_of(worker.pid)
        found = set(processes_marked(mark))
        titles = {pid: command_of(pid) for pid in (worker.pid, server)}
        os.killpg(worker.pid, signal.SIGKILL)
        await worker.wait()
        await warm.close()
        return worker.pid, server, found, titles

    try:
        worker, server, found, titles = asyncio.run(scenario())
    finally:
        started.close()
    assert {worker, server} <= found
    assert titles[worker].rstrip() == f"{PY} {tmp_path / 'sleeper.py'}"
    assert titles[server].rstrip().endswith("-m unicron.control.agent.forkserver (from a template)")


AGENT = """
import asyncio, os, sys
from pathlib import Path
from bench.leftovers import MARK_VARIABLE, processes_marked
from unicron.control.agent import warmstart
warmstart.PRELOAD = ()
async def main():
    warm = warmstart.WarmStarts(Path(sys.argv[1]) / "servers", template=Path(sys.argv[2]))
    log = Path(sys.argv[1]) / "sleeper.log"
    log.touch()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    worker = await warm.launch([sys.executable, sys.argv[3], "98"], env, log)
    print(worker.pid, flush=True)
    await asyncio.sleep(600)
asyncio.run(main())
"""


@pytest.mark.timeout(120)
def test_a_forked_server_and_its_workers_end_with_the_agent_that_asked_for_it(
    template: Template, tmp_path: Path
) -> None:
    """The server is the template's child, not the agent's: no parent-death signal ends it when
    the agent is killed, but its watch on the agent does, and its worker dies with it."""
    agent = subprocess.Popen(
        [PY, "-c", AGENT, str(tmp_path), str(template.socket), str(tmp_path / "probe.py")],
        stdout=subprocess.PIPE,
    )
    assert agent.stdout is not None
    worker = int(agent.stdout.readline())
    server = parent_of(worker)
    assert parent_of(server) == template.process.pid
    agent.kill()
    agent.wait()
    assert ended([server, worker]), "the server or its worker outlived the agent"
    assert template.serving  # the template serves on


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare")
@pytest.mark.timeout(120)
def test_an_agent_in_a_network_namespace_of_its_own_gets_a_server_and_workers_in_it(
    template: Template, tmp_path: Path
) -> None:
    """An agent on a test host runs in a network namespace of its own (here ``unshare --net``):
    the server the template forks for it enters that namespace, and so does its worker."""
    agent = subprocess.Popen(
        [
            "unshare",
            "--net",
            PY,
            "-c",
            AGENT,
            str(tmp_path),
            str(template.socket),
            str(tmp_path / "probe.py"),
        ],
        stdout=subprocess.PIPE,
    )
    assert agent.stdout is not None
    try:
        worker = int(agent.stdout.readline())
        server = parent_of(worker)
        assert parent_of(server) == template.process.pid  # forked by the template, not started
        network = {p: os.readlink(f"/proc/{p}/ns/net") for p in (agent.pid, server, worker)}
        assert len(set(network.values())) == 1, network
        assert network[worker] != os.readlink(f"/proc/{template.process.pid}/ns/net")
    finally:
        agent.kill()
        agent.wait()


@pytest.mark.timeout(60)
def test_the_template_ends_with_the_process_that_started_it(tmp_path: Path) -> None:
    starter = subprocess.Popen(
        [PY, "-c", "import sys, time\nfrom unicron.control.agent.template import Template\n"
         "t = Template([])\nprint(t.process.pid, t.folder, flush=True)\ntime.sleep(600)"],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    assert starter.stdout is not None
    pid, folder = starter.stdout.readline().split()
    starter.send_signal(signal.SIGKILL)
    starter.wait()
    try:
        assert ended([int(pid)]), "the template outlived its starter"
    finally:
        shutil.rmtree(folder, ignore_errors=True)

"""The coordinator and an agent say, as they start, what a user needs to go on (where the
coordinator serves, its state directory, the dashboard, the commands that make tokens; the
agent's node, slots, GPUs and coordinator) and, when they stop, why. docs/live-cluster.md shows
these lines as the code prints them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from unicron.cli import announce
from unicron.control.agent import agent
from unicron.control.agent.hostaddress import NodeAddress
from unicron.control.launch.localcluster import LocalCluster

DOCS = Path(__file__).resolve().parents[1] / "docs" / "live-cluster.md"


def said(log: Path, who: str) -> list[str]:
    """The lines ``who`` ("coordinator", "agent NODE") printed to ``log``, without its prefix."""
    text = log.read_text() if log.exists() else ""
    return [line.removeprefix(f"{who}: ") for line in text.splitlines() if line.startswith(f"{who}: ")]


@pytest.mark.timeout(180)
def test_the_coordinator_and_an_agent_say_what_they_are_and_why_they_stop(tmp_path: Path) -> None:
    root = tmp_path / "cluster"
    coordinator_log, agent_log = root / "logs" / "coordinator.log", root / "logs" / "agent-node-0.log"
    cluster = LocalCluster(root, nodes=1, slots=1)
    try:
        cluster.start()  # returns once the agent has registered
        url = cluster.url
        to_say = announce.started_lines(url, f"127.0.0.1:{cluster.port}", root / "coordinator", None)
        where = NodeAddress()
        agent_says = agent.started_lines("node-0", 1, [], url, where, root / "agents" / "node-0")
        agent_says.append(agent.registered_line(url))
        cluster.wait(lambda: said(coordinator_log, "coordinator") == to_say, 30, "its start lines")
        cluster.wait(lambda: said(agent_log, "agent node-0") == agent_says, 30, "the agent's")
        process = cluster.agents.pop("node-0")
        os.killpg(process.pid, signal.SIGTERM)
        assert process.wait(30) == 0
        stopped = [agent.stopping_line("SIGTERM received", 0), agent.STOPPED]
        assert said(agent_log, "agent node-0") == agent_says + stopped
        server = cluster.coordinators.pop(0)
        os.killpg(server.pid, signal.SIGTERM)
        # uvicorn raises the signal again once it has shut down: the status says what ended it.
        assert server.wait(30) in (0, -signal.SIGTERM)
        stopped = [announce.stopping_line("SIGTERM received"), announce.STOPPED]
        assert said(coordinator_log, "coordinator") == to_say + stopped
    finally:
        cluster.close()
    for log in (coordinator_log, agent_log):
        assert "Traceback" not in log.read_text(), log.read_text()


def test_a_coordinator_that_cannot_listen_says_so_and_exits_3(tmp_path: Path) -> None:
    with socket_in_use() as port:
        argv = [sys.executable, "-m", "unicron.cli.main", "coordinator", "--port", str(port)]
        ended = run([*argv, "--state-dir", str(tmp_path / "state")])
    assert ended.returncode == 3, ended.stderr
    assert "address already in use" in ended.stderr, ended.stderr
    assert ended.stderr.splitlines()[-1] == f"coordinator: {announce.NOT_STARTED}", ended.stderr
    assert "coordinator: serving" not in ended.stderr  # a port it never held is not announced


def test_an_agent_whose_loop_fails_says_why_and_exits_1(tmp_path: Path) -> None:
    """Its run folder cannot be made (a file is in the way): before, it waited for a signal
    forever with nothing running, silently."""
    (tmp_path / "file").write_text("")
    argv = [sys.executable, "-m", "unicron.cli.main", "agent", "--node", "n0"]
    ended = run([*argv, "--run-dir", str(tmp_path / "file" / "run")])
    lines = said_in(ended.stderr, "agent n0")
    assert ended.returncode == 1, ended.stderr
    assert lines[-2].startswith("stopping: error: NotADirectoryError"), lines
    assert lines[-1] == agent.STOPPED and "Traceback" not in ended.stderr, ended.stderr


def said_in(text: str, who: str) -> list[str]:
    return [line.removeprefix(f"{who}: ") for line in text.splitlines() if line.startswith(f"{who}: ")]


def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UNICRON_")}
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)


class socket_in_use:
    """A loopback port held (bound and listening) for the length of a ``with``."""

    def __enter__(self) -> int:
        import socket

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        return int(self.sock.getsockname()[1])

    def __exit__(self, *_: object) -> None:
        self.sock.close()


# ------------------------------------------------------------------ the docs show them as printed
# The values of docs/live-cluster.md's recipe; the agent started in /home/you on a node NODE.
RECIPE_URL = "http://COORD:8470"
RECIPE_STATE = Path("/var/lib/unicron")
RECIPE_GPUS = [str(i) for i in range(8)]


def documented_start() -> str:
    coordinator = announce.started_lines(RECIPE_URL, "COORD:8470", RECIPE_STATE, None)
    where, run_dir = NodeAddress("NODE_ADDRESS"), Path("/home/you/.unicron/agents/NODE")
    started = agent.started_lines("NODE", len(RECIPE_GPUS), RECIPE_GPUS, RECIPE_URL, where, run_dir)
    return "\n".join(
        [f"coordinator: {line}" for line in coordinator]
        + [f"agent NODE: {line}" for line in [*started, agent.registered_line(RECIPE_URL)]]
    )


def documented_stop() -> str:
    stopping = agent.stopping_line("SIGTERM received", len(RECIPE_GPUS))
    lines = [f"agent NODE: {stopping}", f"agent NODE: {agent.STOPPED}"]
    lines += [f"coordinator: {announce.stopping_line('SIGINT received')}", f"coordinator: {announce.STOPPED}"]
    return "\n".join(lines)


@pytest.mark.parametrize("block", [documented_start, documented_stop], ids=["start", "stop"])
def test_the_docs_show_the_lines_as_printed(block: Callable[[], str]) -> None:
    expected = block()
    assert f"```\n{expected}\n```" in DOCS.read_text(), f"docs/live-cluster.md should show:\n{expected}"


def test_the_docs_name_the_line_of_a_coordinator_that_could_not_start() -> None:
    assert f"`coordinator: {announce.NOT_STARTED}`" in DOCS.read_text()

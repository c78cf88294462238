"""The README's live-cluster recipe, run as written from a temporary folder: the coordinator, the
tokens, two agents (the recipe's agent line once per node, as its comment says), submit, status,
events, logs and cancel, each the README's own command line. Only the port is changed (a free
one, given to the commands without --coordinator as UNICRON_COORDINATOR; another if a parallel
test took it first), and the example files
are named from the clone (the recipe runs in it). The task must
finish, and every command must end without a traceback."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from unicron.control.launch.localcluster import free_port

ROOT = Path(__file__).resolve().parents[1]
UNICRON = str(Path(sys.executable).parent / "unicron")
DEADLINE_S = 240.0


def recipe() -> list[str]:
    """The command lines of the README's block under "Running the live system"."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Running the live system", 1)[1]
    block = section.split("```", 2)[1]
    lines = [re.sub(r"\s+#.*$", "", line).strip() for line in block.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def words(line: str, port: int) -> list[str]:
    """One command line as argv: the port made free, the examples named from the clone."""
    line = line.replace("8470", str(port)).replace("examples/", f"{ROOT}/examples/")
    argv = shlex.split(line)
    assert argv[0] == "unicron", line
    return [UNICRON, *argv[1:]]


@pytest.fixture
def folder(tmp_path: Path) -> Iterator[Path]:
    here = os.getcwd()
    os.chdir(tmp_path)
    yield tmp_path
    os.chdir(here)


def run(argv: list[str], env: dict[str, str], cwd: Path, timeout: float = 60.0) -> str:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    out = done.stdout + done.stderr
    assert done.returncode == 0 and "Traceback" not in out, f"{argv}: {out}"
    return out


def started(argv: list[str], env: dict[str, str], cwd: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)


def wait_for(what: str, check: Callable[[], bool], deadline: float) -> None:
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"not within the deadline: {what}")


def coordinator(
    line: str, env: dict[str, str], folder: Path, deadline: float
) -> tuple[subprocess.Popen[bytes], int]:
    """The recipe's coordinator, serving, and its port. A port found free may be taken by another
    test before the coordinator binds it: the coordinator then stops, saying so, and is started
    again on another (three tries)."""
    log = folder / "coordinator.log"
    for _ in range(3):
        port = free_port()
        daemon = started(words(line, port), env, folder, log)
        wait_for(
            "the coordinator serves or stops",
            lambda daemon=daemon: "serving" in log.read_text() or daemon.poll() is not None,
            deadline,
        )
        if daemon.poll() is None:
            return daemon, port
        assert "address already in use" in log.read_text(), log.read_text()
    raise AssertionError(f"no free port for the coordinator in three tries: {log.read_text()}")


def test_the_readmes_live_recipe_runs_as_written_from_any_folder(folder: Path) -> None:
    lines, port = recipe(), 0
    deadline = time.monotonic() + DEADLINE_S
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("UNICRON_TOKEN_FILE", None)
    daemons: list[subprocess.Popen[bytes]] = []
    try:
        for line in lines:
            command = line.split()[1]
            if command == "coordinator":
                daemon, port = coordinator(line, env, folder, deadline)
                daemons.append(daemon)
                env["UNICRON_COORDINATOR"] = f"http://127.0.0.1:{port}"
            elif command == "token" and "--role agent" in line:
                for node in ("n0", "n1"):  # "one per node"
                    run(words(line.replace("n0", node), port), env, folder)
            elif command == "agent":
                for node in ("n0", "n1"):
                    log = folder / f"agent-{node}.log"
                    daemons.append(started(words(line.replace("n0", node), port), env, folder, log))
                for node in ("n0", "n1"):
                    log = folder / f"agent-{node}.log"
                    wait_for(f"{node} registers", lambda log=log: "registered" in log.read_text(), deadline)
            elif "&& export" in line:
                first, export = line.split("&&")
                run(words(first.strip(), port), env, folder)
                name, _, value = export.strip().removeprefix("export ").partition("=")
                env[name] = value
            elif command == "logs":
                out = run(words(line, port), env, folder, timeout=max(1.0, deadline - time.monotonic()))
                assert "step" in out, out  # rank 0's output, followed until the worker exited
                wait_for(
                    "tinygpt finishes",
                    lambda port=port: "finished" in run(words("unicron status", port), env, folder),
                    deadline,
                )
            elif command == "status":
                assert "tinygpt" in run(words(line, port), env, folder)
            elif command == "cancel":
                assert "nothing to cancel" in run(words(line, port), env, folder)
            else:
                run(words(line, port), env, folder)
        status = run(words("unicron status", port), env, folder)
        assert re.search(r"tinygpt\s.*finished", status), status
    finally:
        for daemon in reversed(daemons):
            daemon.terminate()
        for daemon in daemons:
            try:
                daemon.wait(timeout=30)
            except subprocess.TimeoutExpired:
                daemon.kill()

"""Warm starts: workers forked from a fork server run exactly as a new interpreter would run them.

Real processes throughout (a fork server that imports torch, real forks, real signals); the
choice of what may start warm and the server's key are pure and tested by hand.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import pytest

from unicron.control.agent import warmstart
from unicron.control.agent.warmstart import Forked, WarmStarts, environment_key, warm_argv

PY = sys.executable

# What a worker can see of its start: its arguments, module name, environment, directory,
# session, parent, command line and random state.
PROBE = """
import json, os, random, sys
import numpy, torch
print(json.dumps({
    "argv": sys.argv, "name": __name__, "rank": os.environ.get("RANK"),
    "task_var": os.environ.get("TASK_VAR"), "cwd": os.getcwd(), "path0": sys.path[0],
    "own_group": os.getpgid(0) == os.getpid(), "parent": os.getppid(),
    "torch": torch.rand(3).tolist(), "numpy": numpy.random.random(), "random": random.random(),
    "cmdline": open("/proc/self/cmdline", "rb").read().rstrip(b"\\0").decode(),
    "comm": open("/proc/self/comm").read().strip(),
}))
code = int(sys.argv[1])
if code == 99:
    raise RuntimeError("the program failed")
if code == 98:
    import time
    time.sleep(600)
sys.exit(code)
"""


def test_only_the_agents_interpreter_running_a_script_or_module_starts_warm() -> None:
    assert warm_argv([PY, "train.py", "--lr", "1"], PY)
    assert warm_argv([PY, "-m", "pkg.train"], PY)
    assert not warm_argv([PY, "-m"], PY)
    assert not warm_argv([PY, "-u", "train.py"], PY)  # the server's options would not be these
    assert not warm_argv([PY, "-c", "print(1)"], PY)
    assert not warm_argv(["/other/python", "train.py"], PY)
    assert not warm_argv(["bash", "run.sh"], PY)
    assert not warm_argv([PY], PY)


def test_a_server_is_keyed_by_the_environment_less_what_each_launch_sets() -> None:
    base = {"PATH": "/bin", "TASK_VAR": "a"}
    same = {**base, "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "CUDA_VISIBLE_DEVICES": "1"}
    assert environment_key(same) == environment_key({**base, "UNICRON_GENERATION": "7"})
    assert environment_key(base) != environment_key({**base, "TASK_VAR": "b"})
    assert environment_key(base) != environment_key({**base, "OMP_NUM_THREADS": "1"})
    # The worker contract is read when a session starts; a variable of the run is the server's too
    # (leftovers.py finds every process a run started by its mark, forked workers included).
    assert environment_key(base) == environment_key({**base, "UNICRON_TRACE_FILE": "/t.jsonl"})
    assert environment_key(base) != environment_key({**base, "UNICRON_RUN_MARK": "run-1"})
    # What a server imported is what it is: a task's preload is its own server's.
    assert environment_key(base) != environment_key({**base, "UNICRON_PRELOAD": "transformers"})


# For what torch's part in the server does not change (which server a worker comes from, what
# ends with it): the probe without numpy and torch, forked from servers that import nothing
# (``bare``), a twentieth of a torch server's start.
BARE_PROBE = PROBE.replace("import numpy, torch", "").replace(
    '"torch": torch.rand(3).tolist(), "numpy": numpy.random.random(), ', ""
)
assert "torch" not in BARE_PROBE and "numpy" not in BARE_PROBE


@pytest.fixture
def bare(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(warmstart, "PRELOAD", ())
    (tmp_path / "probe.py").write_text(BARE_PROBE)


async def _launch(warm: WarmStarts, tmp: Path, name: str, code: int, **env: str) -> Forked:
    if not (tmp / "probe.py").exists():  # (rewritten, a worker starting meanwhile might read it empty)
        (tmp / "probe.py").write_text(PROBE)
    argv = [PY, str(tmp / "probe.py"), str(code)]
    return await _forked(warm, argv, {**os.environ, **env}, tmp / f"{name}.log")


async def _forked(warm: WarmStarts, argv: list[str], env: dict[str, str], log: Path) -> Forked:
    """Forked by its environment's server (started, and waited for, by the first launch)."""
    log.touch()  # (the agent creates the log, private; the worker appends to it)
    launched = await warm.launch(argv, env, log)
    assert launched is not None
    return launched


async def _started(log: Path) -> None:
    """Until the program has printed its first line (bounded by the test's timeout)."""
    while not (log.exists() and log.read_text()):
        await asyncio.sleep(0.05)


def _seen(tmp: Path, name: str) -> dict[str, object]:
    first: dict[str, object] = json.loads((tmp / f"{name}.log").read_text().splitlines()[0])
    return first


@pytest.mark.timeout(120)
def test_a_forked_worker_runs_its_program_as_a_new_interpreter_would(tmp_path: Path) -> None:
    async def scenario() -> dict[str, int]:
        warm = WarmStarts(tmp_path / "servers")
        codes = {}
        ok = await _launch(warm, tmp_path, "ok", 0, RANK="0")
        five = await _launch(warm, tmp_path, "five", 5, RANK="1")
        failed = await _launch(warm, tmp_path, "failed", 99, RANK="2")
        codes.update(ok=await ok.wait(), five=await five.wait(), failed=await failed.wait())
        sleeper = await _launch(warm, tmp_path, "term", 98, RANK="3")
        await _started(tmp_path / "term.log")
        os.killpg(sleeper.pid, signal.SIGTERM)  # its own group, as the agent signals it
        codes["term"] = await sleeper.wait()
        absent = [PY, str(tmp_path / "absent.py")]
        missing = await _forked(warm, absent, dict(os.environ), tmp_path / "absent.log")
        codes["absent"] = await missing.wait()
        (tmp_path / "pkg").mkdir()
        (tmp_path / "pkg" / "__init__.py").write_text("")
        (tmp_path / "pkg" / "mod.py").write_text(PROBE)
        env = {**os.environ, "PYTHONPATH": str(tmp_path)}
        module = await _forked(warm, [PY, "-m", "pkg.mod", "0"], env, tmp_path / "module.log")
        codes["module"] = await module.wait()
        assert await warm.launch([PY, "-c", "pass"], dict(os.environ), tmp_path / "c.log") is None
        await warm.close()
        return codes

    codes = asyncio.run(scenario())
    assert codes == {"ok": 0, "five": 5, "failed": 1, "term": -signal.SIGTERM, "absent": 2, "module": 0}
    ok = _seen(tmp_path, "ok")
    assert ok["argv"] == [str(tmp_path / "probe.py"), "0"] and ok["name"] == "__main__"
    assert ok["rank"] == "0" and _seen(tmp_path, "five")["rank"] == "1"
    assert ok["cwd"] == os.getcwd() and ok["path0"] == str(tmp_path) and ok["own_group"]
    # ps shows the worker's command, under the interpreter's short name.
    assert ok["cmdline"] == f"{PY} {tmp_path / 'probe.py'} 0" and ok["comm"] == Path(PY).name[:15]
    assert "RuntimeError: the program failed" in (tmp_path / "failed.log").read_text()
    assert "can't open file" in (tmp_path / "absent.log").read_text()
    module = _seen(tmp_path, "module")
    assert module["argv"] == [str(tmp_path / "pkg" / "mod.py"), "0"] and module["name"] == "__main__"
    # Random state as new processes have it, each its own (torch, NumPy and Python seed theirs
    # from entropy in a new process): not copies of the one server's.
    five = _seen(tmp_path, "five")
    assert ok["torch"] != five["torch"] and ok["numpy"] != five["numpy"] and ok["random"] != five["random"]


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("bare")
def test_another_environment_gets_another_server_and_workers_die_with_theirs(tmp_path: Path) -> None:
    async def scenario() -> tuple[int, int]:
        warm = WarmStarts(tmp_path / "servers")
        a = await _launch(warm, tmp_path, "a", 0, TASK_VAR="a", RANK="0", UNICRON_RANK="0")
        a2 = await _launch(warm, tmp_path, "a2", 0, TASK_VAR="a", RANK="1", UNICRON_RANK="1")
        b = await _launch(warm, tmp_path, "b", 98, TASK_VAR="b")
        await asyncio.gather(a.wait(), a2.wait())
        await _started(tmp_path / "b.log")
        server = int(str(_seen(tmp_path, "b")["parent"]))
        os.kill(server, signal.SIGKILL)  # its worker dies with it, and is reported so
        code = await b.wait()
        again = await _launch(warm, tmp_path, "again", 0, TASK_VAR="b")  # a new server
        await again.wait()
        await warm.close()
        return code, server

    code, killed = asyncio.run(scenario())
    assert code == -signal.SIGKILL
    parents = {n: _seen(tmp_path, n)["parent"] for n in ("a", "a2", "b", "again")}
    assert parents["a"] == parents["a2"] != parents["b"] == killed != parents["again"]
    assert parents["a"] != os.getpid()
    assert _seen(tmp_path, "b")["task_var"] == "b" and _seen(tmp_path, "again")["task_var"] == "b"


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("bare")
def test_a_server_whose_workers_have_all_ended_makes_room_for_another_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(warmstart, "MAX_SERVERS", 1)

    async def scenario() -> tuple[bool, int]:
        warm = WarmStarts(tmp_path / "servers")
        a = await _launch(warm, tmp_path, "a", 98, TASK_VAR="a")  # runs on
        other = {**os.environ, "TASK_VAR": "b"}
        # Every slot holds a server with a running worker: another environment starts cold.
        crowded = warm.prepare(other) is None
        await _started(tmp_path / "a.log")
        os.killpg(a.pid, signal.SIGKILL)
        await a.wait()
        first = int(str(_seen(tmp_path, "a")["parent"]))
        # Its server has no worker left: it goes, and the other environment gets one.
        roomy = await _forked(warm, [PY, str(tmp_path / "probe.py"), "0"], other, tmp_path / "b.log")
        await roomy.wait()
        await warm.close()
        return crowded, first

    crowded, first = asyncio.run(scenario())
    assert crowded
    assert not Path(f"/proc/{first}").exists()  # the first server has ended
    assert _seen(tmp_path, "b")["parent"] != first


@pytest.mark.timeout(120)
def test_a_server_whose_imports_start_a_thread_does_not_serve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child would get the thread's locks as they were and none of the thread: the server says
    why it does not serve, and its environment's workers start as new interpreters."""
    (tmp_path / "threaded.py").write_text(
        "import threading, time\nthreading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
    )
    monkeypatch.setattr(warmstart, "PRELOAD", ("threaded",))
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}

    async def scenario() -> Forked | None:
        warm = WarmStarts(tmp_path / "servers")
        launched = await warm.launch([PY, str(tmp_path / "threaded.py")], env, tmp_path / "w.log")
        await warm.close()
        return launched

    assert asyncio.run(scenario()) is None
    (log,) = (tmp_path / "servers").glob("forkserver-*.log")
    assert "started Python threads; not serving" in log.read_text()


@pytest.mark.timeout(120)
def test_a_tasks_preload_is_imported_once_by_its_server_before_the_fork(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``run.preload`` (the contract's UNICRON_PRELOAD): the server imports the named modules
    before it forks, so each worker finds them imported (by its parent, the server, once), and a
    task without them gets a server of its own that did not import them."""
    (tmp_path / "heavy.py").write_text("import os\nIMPORTED_BY = os.getpid()\n")
    (tmp_path / "worker.py").write_text(
        "import json, os, sys\nheavy = sys.modules.get('heavy')\n"
        "print(json.dumps({'by': heavy and heavy.IMPORTED_BY, 'parent': os.getppid()}))\n"
    )
    monkeypatch.setattr(warmstart, "PRELOAD", ())  # (torch's imports are not what is shown here)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}

    async def scenario() -> None:
        warm = WarmStarts(tmp_path / "servers")
        for i, extra in enumerate([{"UNICRON_PRELOAD": "heavy,json"}] * 2 + [{}]):
            worker = await _forked(
                warm, [PY, str(tmp_path / "worker.py")], {**env, **extra}, tmp_path / f"{i}.log"
            )
            assert await worker.wait() == 0
        await warm.close()

    asyncio.run(scenario())
    seen = [_seen(tmp_path, str(i)) for i in range(3)]
    assert seen[0]["by"] == seen[0]["parent"] == seen[1]["by"] == seen[1]["parent"]  # once, by the server
    assert seen[2]["by"] is None and seen[2]["parent"] != seen[0]["parent"]  # another server, which did not


def test_a_server_that_cannot_start_leaves_its_workers_to_new_interpreters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever its start raised, a launch is not lost: it starts as a new interpreter (None
    here), and the next launch tries a server again."""
    tries: list[int] = []

    async def broken(cls: type, env: dict[str, str], log: Path, template: Path | None) -> None:
        tries.append(1)
        raise RuntimeError("no server")

    monkeypatch.setattr(warmstart.ForkServer, "start", classmethod(broken))

    async def scenario() -> list[Forked | None]:
        warm = WarmStarts(tmp_path / "servers")
        argv = [PY, str(tmp_path / "train.py")]
        launched = [await warm.launch(argv, dict(os.environ), tmp_path / "w.log") for _ in range(2)]
        await warm.close()
        return launched

    assert asyncio.run(scenario()) == [None, None] and len(tries) == 2

"""`unicron submit` in process, from a folder other than the repository's root: a task file's
relative paths are taken from the file's folder and sent absolute, a program that is not there
is refused with the path tried (an error, no traceback), and cancelling an ended task says so.
The coordinator's HTTP answers are played by the test (``Api.request``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from unicron.cli.live import Api
from unicron.cli.main import main
from unicron.core.livespecs import parse_live_tasks

from .conftest import ROOT


class Coordinator:
    """What the CLI sent, and the answers a coordinator would give."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sent: list[tuple[str, str, dict[str, Any]]] = []
        self.answer: Any = None
        monkeypatch.setattr(Api, "request", self.request)

    def request(self, method: str, path: str, **kwargs: Any) -> Any:  # in place of Api.request
        self.sent.append((method, path, kwargs))
        if method == "POST":
            return [{**t, "weight": 1.0, "iterations": 60, "run": 1} for t in self.tasks()]
        return self.answer

    def tasks(self) -> list[dict[str, Any]]:
        """The tasks of the last submission, as the coordinator parses them."""
        body = self.sent[-1][2]["content"].decode()
        return [s.model_dump() for s in parse_live_tasks(body, "request body")]


def unicron(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """Run the command as `unicron` does; its exit status and everything it printed."""
    with pytest.raises(SystemExit) as ended:
        main([*args, "--coordinator", "http://127.0.0.1:9"])
    out = capsys.readouterr()
    return int(ended.value.code or 0), out.out + out.err


@pytest.fixture
def coordinator(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Coordinator:
    monkeypatch.chdir(tmp_path)  # not the repository's root
    monkeypatch.delenv("UNICRON_TOKEN_FILE", raising=False)
    return Coordinator(monkeypatch)


def test_the_readmes_task_file_runs_from_any_folder(coordinator: Coordinator, capsys: Any) -> None:
    code, out = unicron(capsys, "submit", str(ROOT / "examples" / "tinygpt" / "task.yaml"))
    assert code == 0 and "submitted tinygpt" in out, out
    (task,) = coordinator.tasks()
    assert task["run"]["program"][:2] == ["python", str(ROOT / "examples" / "tinygpt" / "train.py")]
    code, out = unicron(capsys, "submit", str(ROOT / "examples" / "demo" / "tasks.yaml"))
    assert code == 0, out
    programs = {t["name"]: t["run"]["program"][1] for t in coordinator.tasks()}
    assert programs["alpha"] == str(ROOT / "examples" / "tinygpt" / "train.py")
    assert programs["gamma"] == str(ROOT / "examples" / "fsdp" / "train.py")


def test_paths_are_relative_to_the_task_file(coordinator: Coordinator, capsys: Any, tmp_path: Path) -> None:
    job = tmp_path / "job"
    (job / "data").mkdir(parents=True)
    for name in ("train.py", "data/train.bin", "conf.yaml"):
        (job / name).write_text("")
    (job / "task.yaml").write_text(
        "name: mine\nweight: 1\nthroughput: {1: 1.0e9}\nrun:\n"
        "  program: [python, -u, train.py, --data, data/train.bin, --config=conf.yaml, --out, out/model.pt,"
        " --steps, 10, --mode, train]\n  iterations: 10\n"
    )
    code, out = unicron(capsys, "submit", "job/task.yaml")
    assert code == 0, out
    (task,) = coordinator.tasks()
    assert task["run"]["program"] == [
        "python", "-u", str(job / "train.py"), "--data", str(job / "data" / "train.bin"),
        f"--config={job / 'conf.yaml'}", "--out", "out/model.pt", "--steps", "10", "--mode", "train",
    ]  # fmt: skip
    # --no-resolve: as written (a machine without the nodes' files)
    code, out = unicron(capsys, "submit", "job/task.yaml", "--no-resolve")
    assert code == 0 and coordinator.tasks()[0]["run"]["program"][2] == "train.py"


def test_a_program_that_is_not_there_is_refused_with_the_path_tried(
    coordinator: Coordinator, capsys: Any, tmp_path: Path
) -> None:
    (tmp_path / "job").mkdir()
    (tmp_path / "train.py").write_text("")  # in the current folder, not beside the task file
    task = "{name: %s, weight: 1, throughput: {1: 1e9}, run: {program: %s, iterations: 5}}"
    (tmp_path / "job" / "task.yaml").write_text(
        "tasks:\n"
        + "".join(
            f"  - {task % (name, argv)}\n"
            for name, argv in (
                ("a", "[python, -m, mypkg]"),
                ("b", "[python, train.py]"),
                ("c", "[./run.sh, x]"),
                ("d", "[torchrun, t.py]"),
            )
        )
    )
    code, out = unicron(capsys, "submit", "job/task.yaml")
    assert code == 2 and "Traceback" not in out and coordinator.sent == []  # nothing was sent
    assert "tasks[1].run.program[1]: the program 'train.py' is not there: tried " in out
    assert str(tmp_path / "job" / "train.py") in out and "relative to the current folder" in out
    assert (
        f"tasks[2].run.program[0]: the program './run.sh' is not there: tried {tmp_path / 'job' / 'run.sh'}"
        in out
    )
    assert "tasks[0]" not in out and "tasks[3]" not in out  # a module, a command on the nodes' PATH
    assert "--no-resolve" in out
    code, out = unicron(capsys, "submit", "job/nothing.yaml")
    assert code == 2 and "job/nothing.yaml" in out and "cannot read the file" in out
    (tmp_path / "job" / "binary.yaml").write_bytes(b"\xff\xfe\x00")
    code, out = unicron(capsys, "submit", "job/binary.yaml")
    assert code == 2 and "not a text file" in out and "Traceback" not in out


def test_cancelling_an_ended_task_says_its_state(coordinator: Coordinator, capsys: Any) -> None:
    ended = {"name": "lm", "state": "failed", "step": 7, "iterations": 60, "cancelled": False}
    coordinator.answer = ended
    code, out = unicron(capsys, "cancel", "lm")
    assert code == 0 and "lm has already failed (at step 7/60): nothing to cancel" in out, out
    coordinator.answer = {**ended, "state": "cancelled", "cancelled": True}
    code, out = unicron(capsys, "cancel", "lm")
    assert code == 0 and out.strip() == "lm: cancelled"

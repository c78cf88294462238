"""`unicron plan` as users run it: a real subprocess, JSON output, events, clear errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from unicron.cli.main import main

from .conftest import ROOT

EXAMPLE = [str(ROOT / "examples" / "cluster-128.yaml"), str(ROOT / "examples" / "tasks-gpt3.yaml")]


def unicron(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "unicron.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_plan_json_has_plan_waf_objective() -> None:
    out = unicron("plan", *EXAMPLE, "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert set(data["plan"]) == {"gpt3-1.3b", "gpt3-2.7b", "gpt3-6.7b", "gpt3-13b"}
    assert sum(data["plan"].values()) <= 128
    assert data["waf"] > 0 and data["objective"] > 0
    assert data["waf"] == pytest.approx(sum(t["waf_after"] for t in data["tasks"]))


@pytest.mark.parametrize("event", ["node-lost:3", "node-back", "task-done:gpt3-13b"])
def test_plan_answers_events(event: str) -> None:
    out = unicron("plan", *EXAMPLE, "--json", "--event", event)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["event"] == event
    capacity = {"node-lost:3": 120, "node-back": 136, "task-done:gpt3-13b": 128}[event]
    assert data["capacity_gpus"] == capacity and sum(data["plan"].values()) <= capacity
    if event.startswith("task-done"):
        assert data["plan"]["gpt3-13b"] == 0


def test_plan_table_output() -> None:
    out = unicron("plan", *EXAMPLE, "--event", "node-lost:0")
    assert out.returncode == 0, out.stderr
    assert "lost 8 GPUs with the node" in out.stdout and "cluster WAF" in out.stdout


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--event", "node-lost:99"], "node 99 is not in service"),
        (["--event", "explode"], "unknown event 'explode'"),
        (["--event", "task-done:nobody"], "no task named 'nobody'"),
    ],
)
def test_bad_events_are_messages(args: list[str], words: str) -> None:
    out = unicron("plan", *EXAMPLE, *args)
    assert out.returncode == 2 and words in out.stderr and "Traceback" not in out.stderr


def test_bad_files_are_messages(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks.yaml"
    tasks.write_text("tasks:\n  - name: x\n    weight: -2\n    throughput: {8: 1e15}\n")
    out = unicron("plan", EXAMPLE[0], str(tasks))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert str(tasks) in out.stderr and "tasks[0](x).weight" in out.stderr
    missing = unicron("plan", str(tmp_path / "none.yaml"), str(tasks))
    assert missing.returncode == 2 and "cannot read the file" in missing.stderr


def test_plan_does_not_import_torch() -> None:
    code = (
        "import sys; from unicron.cli.main import main\n"
        f"sys.argv = ['unicron', 'plan', {EXAMPLE[0]!r}, {EXAMPLE[1]!r}, '--json']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "assert 'torch' not in sys.modules, 'planner imported torch'\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_coordinator_refuses_inconsistent_timeouts_at_start(tmp_path: Path) -> None:
    settings = tmp_path / "settings.yaml"
    settings.write_text("hang_cap_s: 2000\n")
    out = unicron("coordinator", "--settings", str(settings), "--state-dir", str(tmp_path / "state"))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "hang_cap_s (2000) must be < process_group_timeout_s" in out.stderr and "fix:" in out.stderr


# ---------------------------------------------------------------- in process: what a reader sees


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``unicron ARGS`` in this process: its exit code, stdout and stderr."""
    try:
        main(list(args))
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    else:
        code = 0
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize(
    ("files", "words"),
    [
        (EXAMPLE[::-1], "the two files are swapped"),
        ([EXAMPLE[1], EXAMPLE[1]], "tasks-gpt3.yaml holds tasks, where the cluster file goes"),
        ([EXAMPLE[0], EXAMPLE[0]], "cluster-128.yaml holds a cluster, where the tasks file goes"),
    ],
)
def test_files_in_the_wrong_places_are_one_error_naming_the_order(
    capsys: pytest.CaptureFixture[str], files: list[str], words: str
) -> None:
    code, _, err = cli(capsys, "plan", *files)
    assert code == 2 and words in err, err
    assert "usage: unicron plan CLUSTER.yaml TASKS.yaml" in err and "Field required" not in err
    assert len(err.strip().splitlines()) == 1, err


def test_node_back_on_a_full_cluster_says_it_plans_a_node_beyond_its_size(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = cli(capsys, "plan", *EXAMPLE, "--event", "node-back")
    assert code == 0, err
    said = " ".join(out.split())
    assert "every node of the cluster (16) is in service" in said and "node 16, 136 GPUs in all" in said
    code, out, err = cli(capsys, "plan", *EXAMPLE, "--event", "node-back", "--json")
    data = json.loads(out)
    assert data["capacity_gpus"] == 136 and "beyond its size: node 16" in data["note"]
    code, out, err = cli(capsys, "plan", *EXAMPLE, "--json")
    assert json.loads(out)["note"] is None  # (no event: nothing to explain)


def test_gpus_a_plan_leaves_idle_are_said_with_why(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(capsys, "plan", *EXAMPLE, "--event", "task-done:gpt3-13b", "--json")
    assert code == 0, err
    data = json.loads(out)
    idle = data["capacity_gpus"] - sum(data["plan"].values())
    assert idle > 0 and data["idle_gpus"] == idle
    assert len(data["idle_why"]) == 3 and all("max_workers (32)" in why for why in data["idle_why"])
    code, out, err = cli(capsys, "plan", *EXAMPLE, "--event", "task-done:gpt3-13b")
    assert f"{idle} of the 128 GPUs left idle: gpt3-1.3b has its max_workers (32)" in " ".join(out.split())
    code, out, err = cli(capsys, "plan", *EXAMPLE, "--json")
    assert json.loads(out)["idle_gpus"] == 0  # the example's plan uses every GPU


def test_idle_gpus_that_no_count_of_a_task_fits_say_so(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    cluster, tasks = tmp_path / "cluster.yaml", tmp_path / "tasks.yaml"
    cluster.write_text("nodes: 3\ngpus_per_node: 4\ngpu: A100\nnode_mtbf_hours: 1000\n")
    tasks.write_text("tasks:\n  - name: t\n    weight: 1\n    throughput: {8: 1.0e15}\n")
    code, out, err = cli(capsys, "plan", str(cluster), str(tasks), "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["plan"] == {"t": 8} and data["idle_gpus"] == 4
    assert data["idle_why"] == ["t runs on no count from 9 to 12 (8)"]

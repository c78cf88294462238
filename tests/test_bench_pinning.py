"""The overhead benchmark's pinning (bench/pinning.py): which core each worker and the control
processes get, and a real worker process started through ``bench/steptimes.py`` moved to its
core, alike whichever side numbers it (a launcher's local rank, or torchft's replica group)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.pinning import WORKER_CPUS, Pinning, pinned, plan, threads, worker_index

ROOT = Path(__file__).resolve().parents[1]


def alone(*cores: int) -> list[frozenset[int]]:
    """Cores without hardware siblings, as ``threads`` groups them."""
    return [frozenset({c}) for c in sorted(cores)]


def test_workers_get_cores_of_their_own_and_the_rest_go_to_the_control_processes() -> None:
    assert plan(alone(*range(16)), 4) == Pinning(tuple(range(12)), (12, 13, 14, 15))
    assert plan(alone(0, 1), 1) == Pinning((0,), (1,))
    assert plan(alone(3, 5, 9), 2) == Pinning((3,), (5, 9))


def test_a_workers_hardware_siblings_stay_idle() -> None:
    # 8 physical cores of 2 threads numbered i and i + 8 (as Intel machines list them)...
    split = [frozenset({i, i + 8}) for i in range(8)]
    assert plan(split, 4) == Pinning((0, 1, 2, 3, 8, 9, 10, 11), (4, 5, 6, 7), (12, 13, 14, 15))
    # ... or 2i and 2i + 1 (as many VMs do): two workers never share one core's two threads
    paired = [frozenset({2 * i, 2 * i + 1}) for i in range(8)]
    assert plan(paired, 2) == Pinning(tuple(range(12)), (12, 14), (13, 15))
    assert plan(paired[:2], 2) is None  # 4 threads, but 2 cores: none left for the control


def test_too_few_cores_pin_nothing() -> None:
    assert plan(alone(0, 1), 2) is None  # the control processes would share a worker's core
    assert plan(alone(0, 1), 4) is None
    assert plan(alone(0), 1) is None


def test_the_kernels_topology_groups_the_allowed_threads_by_core(tmp_path: Path) -> None:
    for cpu, siblings in {0: "0,2", 1: "1,3", 2: "0,2", 3: "1,3", 4: "4-5", 5: "4-5"}.items():
        (tmp_path / f"cpu{cpu}" / "topology").mkdir(parents=True)
        (tmp_path / f"cpu{cpu}" / "topology" / "thread_siblings_list").write_text(siblings + "\n")
    assert threads({0, 1, 2, 3, 4, 5}, tmp_path) == [frozenset({0, 2}), frozenset({1, 3}), frozenset({4, 5})]
    # Only the threads this process may use; an unreadable one is a core of its own.
    assert threads({0, 1, 4, 7}, tmp_path) == [frozenset({0}), frozenset({1}), frozenset({4}), frozenset({7})]


def test_a_worker_is_numbered_among_the_whole_cell() -> None:
    assert worker_index({"LOCAL_RANK": "3"}) == 3  # one launcher (DDP) or one agent (Unicron)
    # torchft: replica group 2 of 2 ranks each, its second rank: the cell's fifth worker
    assert worker_index({"LOCAL_RANK": "1", "REPLICA_GROUP_ID": "2", "LOCAL_WORLD_SIZE": "2"}) == 5


def steps_under_timer(tmp_path: Path, env: dict[str, str]) -> dict[str, object]:
    """One optimizer step of a script run through bench/steptimes.py; what the script saw."""
    script = tmp_path / "one_step.py"
    script.write_text(
        "import json, os, sys, torch\n"
        "p = torch.nn.Parameter(torch.ones(2))\n"
        "opt = torch.optim.SGD([p], lr=0.1)\n"
        "p.sum().backward(); opt.step()\n"
        "print(json.dumps({'cores': sorted(os.sched_getaffinity(0))}))\n"
    )
    cmd = [sys.executable, str(ROOT / "bench" / "steptimes.py"), str(tmp_path), str(script)]
    done = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    seen: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    seen["steps"] = [json.loads(p.read_text()) for p in tmp_path.glob("steps-*.json")]
    return seen


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pinning needs two cores")
def test_a_worker_started_through_the_timer_runs_on_its_core_alone(tmp_path: Path) -> None:
    cores = sorted(os.sched_getaffinity(0))
    env = {WORKER_CPUS: f"{cores[0]},{cores[1]}", "LOCAL_RANK": "1"}
    seen = steps_under_timer(tmp_path, env)
    assert seen["cores"] == [cores[1]]
    assert [len(s) for s in seen["steps"]] == [1]  # and its step was timed


def test_an_unpinned_worker_keeps_every_core(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(WORKER_CPUS, raising=False)
    assert steps_under_timer(tmp_path, {})["cores"] == sorted(os.sched_getaffinity(0))


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pinning needs two cores")
def test_a_pinned_cell_moves_this_process_and_puts_everything_back() -> None:
    before = os.sched_getaffinity(0)
    with pinned(1) as pinning:
        assert pinning is not None
        assert os.sched_getaffinity(0) == set(pinning.control)
        assert os.environ[WORKER_CPUS] == str(pinning.workers[0])
        assert pinning.workers[0] not in pinning.control
    assert os.sched_getaffinity(0) == before and WORKER_CPUS not in os.environ
    with pinned(len(before)) as none:  # as many workers as cores: nothing pinned
        assert none is None and os.sched_getaffinity(0) == before


def cell(model: str, workers: int, pinned: bool) -> dict[str, object]:
    """A measured row as the overhead benchmark writes it: 5 pairs, Unicron clearly faster."""
    return {
        "model": model,
        "workers": workers,
        "ratio": 0.9,
        "ddp_step_s": 0.02,
        "unicron_step_s": 0.018,
        "unicron_runs_s": [0.018, 0.0181, 0.0179, 0.018, 0.0182],
        "ddp_runs_s": [0.02, 0.0201, 0.0199, 0.02, 0.0202],
        "pinned": {"control": [0], "workers": [1], "idle": []} if pinned else None,
    }


def test_the_pages_say_which_cells_were_pinned_and_judge_them() -> None:
    from bench import gpu_docs
    from bench.overhead_docs import pinned_text

    rows = [cell("tinygpt", 1, True), cell("gpt-10m", 2, False)]
    assert "Pinned cells" in pinned_text(rows) and ": tinygpt at 1." in pinned_text(rows)
    assert pinned_text([cell("tinygpt", 1, False)]).startswith("No cell was pinned")
    assert gpu_docs.cpu_row(rows[0]).endswith("met | 5 a side, spread 2%, pinned |")
    assert gpu_docs.cpu_row(rows[1]).endswith("unpinned |")
    by_number = cell("tinygpt", 2, False) | {"pinned": {"control": [0], "workers": [1]}}  # before "idle"
    assert gpu_docs.cpu_row(by_number).endswith("pinned by core number |")
    assert "tinygpt at 1 (met), gpt-10m at 2 (met)" in gpu_docs.cpu_note(rows)
    assert "1 of 2 cells were pinned" in gpu_docs.cpu_note(rows)


def test_the_performance_page_tells_a_lent_machines_pinned_cells_from_its_unpinned(tmp_path: Path) -> None:
    from bench.overhead_docs import more_cores

    path = tmp_path / "overhead-cpu.json"
    rows = {"tinygpt-2": cell("tinygpt", 2, True), "gpt-10m-4": cell("gpt-10m", 4, False)}
    cells = {name: {"ok": True, "value": [row]} for name, row in rows.items()}
    path.write_text(json.dumps({"machine": {"cpus": 16}} | cells))
    text = more_cores(path)
    assert "pinned, 1 of these cells (judged the same way): tinygpt at 2: met" in text
    assert "unpinned, 1 cell:" in text and "gpt-10m at 4" not in text
    assert "by core number" not in text  # its pinned cell left the worker's siblings idle
    assert more_cores(tmp_path / "never-run.json") == ""


def test_a_device_call_saves_its_checks_where_no_folder_was_made(tmp_path: Path) -> None:
    from bench.gpu_bench import Sections

    out = tmp_path / "not-made-yet" / "overhead-cpu.json"
    Sections(out, {"cpus": 2}, set(), deadline=float("inf")).run("cell", lambda: [1])
    assert json.loads(out.read_text())["cell"]["value"] == [1]

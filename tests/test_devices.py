"""Where a worker computes and how it waits on a GPU collective (train/devices.py,
gradsync._poll_gpu), the agent's GPUs through the real stack, and docs/gpu.md kept current.

Nothing here needs a GPU: the CUDA queries are replaced where the logic is pure, and the live
test checks what each worker is given, not what it computes on."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from bench import gpu_docs
from unicron.control.launch.localcluster import LocalCluster
from unicron.train import devices, gradsync
from unicron.train.iteration import PeerLostError


def test_without_a_gpu_a_worker_computes_on_the_cpu_over_gloo() -> None:
    assert not torch.cuda.is_available()  # this machine: CI has no GPU
    assert devices.worker_device(3) == torch.device("cpu")
    assert devices.backend(torch.device("cpu")) == "gloo"


@pytest.mark.parametrize(("visible", "local_rank", "index"), [(1, 3, 0), (4, 1, 1), (2, 5, 0)])
def test_a_worker_takes_its_only_gpu_or_the_one_at_its_local_rank(
    monkeypatch: pytest.MonkeyPatch, visible: int, local_rank: int, index: int
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: visible)
    assert devices.worker_device(local_rank) == torch.device("cuda", index)
    backend = devices.backend(torch.device("cuda", index))
    assert backend == "cpu:gloo,cuda:nccl" and devices.uses_nccl(backend)


class Work:
    """A collective that completes after ``polls`` looks (never, with None)."""

    def __init__(self, polls: int | None) -> None:
        self.polls, self.looked, self.waited = polls, 0, False

    def is_completed(self) -> bool:
        self.looked += 1
        return self.polls is not None and self.looked > self.polls

    def wait(self) -> None:
        self.waited = True


class Peers:
    nccl = True  # the task's group on a GPU (a sharded replica's standalone peers are gloo)

    def __init__(self) -> None:
        self.abandoned = False

    def abandon(self) -> None:
        self.abandoned = True


def test_a_completed_gpu_collective_is_waited_on_without_asking_about_peers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(gradsync, "GPU_POLL_S", 0.0)
    work, peers, asked = Work(polls=3), Peers(), []
    gradsync.wait_or_abandon(work, peers, lambda: asked.append(1) or False)  # type: ignore[arg-type, func-returns-value]
    assert work.waited and not peers.abandoned and asked == []


def test_a_gpu_collective_whose_peer_failed_is_aborted(monkeypatch: pytest.MonkeyPatch) -> None:
    from datetime import timedelta

    monkeypatch.setattr(gradsync, "POLL", timedelta(milliseconds=20))
    work, peers, asked = Work(polls=None), Peers(), []

    def failed() -> bool:
        asked.append(time.monotonic())
        return len(asked) >= 2  # the second look at the store finds a failed peer

    with pytest.raises(PeerLostError):
        gradsync.wait_or_abandon(work, peers, failed)  # type: ignore[arg-type]
    assert peers.abandoned and not work.waited
    assert len(asked) == 2 and asked[1] - asked[0] >= 0.015  # the store is asked every POLL, not every look


def test_the_agents_gpus_reach_its_workers_one_each(tmp_path: Path) -> None:
    """LocalCluster(gpus=...) starts its agent with --gpus: each worker sees one of them."""
    out = tmp_path / "seen"
    out.mkdir()
    probe = (
        "import json, os, pathlib, time;"
        f"pathlib.Path({str(out)!r}, os.environ['LOCAL_RANK']).write_text("
        "json.dumps(os.environ.get('CUDA_VISIBLE_DEVICES')));"
        "time.sleep(60)"
    )
    program = json.dumps([sys.executable, "-c", probe])
    spec = (
        f"name: probe\nweight: 1\nthroughput: {{2: 1.0e9}}\nmin_workers: 2\n"
        f"run:\n  program: {program}\n  iterations: 10\n"
    )
    with LocalCluster(tmp_path / "cluster", nodes=1, slots=2, gpus=["3", "5"]) as cluster:
        cluster.submit(spec)
        cluster.wait(lambda: len(list(out.iterdir())) == 2, 60, "both workers to start")
    seen: dict[str, Any] = {p.name: json.loads(p.read_text()) for p in out.iterdir()}
    assert seen == {"0": "3", "1": "5"}


def test_the_committed_gpu_page_is_what_its_measurements_say() -> None:
    assert gpu_docs.OUT.read_text() == gpu_docs.render(), (
        "docs/gpu.md is stale: python -m bench.gpu_bench --docs"
    )


def test_only_the_registered_group_on_a_gpu_is_polled_and_aborted_as_nccl() -> None:
    """A sharded replica's peers (a standalone gloo group) block in ``wait`` and are leaked on
    abandonment even when their tensors are on a GPU; the task's group on a GPU is NCCL."""
    from unicron.train.peers import Peers as RealPeers

    on_gpu = "cpu:gloo,cuda:nccl"
    assert RealPeers(None, 0, 2, on_gpu, standalone=False).nccl
    assert not RealPeers(None, 0, 2, "gloo", standalone=True).nccl
    assert not RealPeers(None, 0, 2, "gloo", standalone=False).nccl


def test_device_calls_run_the_named_checks_within_their_budget_and_merge_across_calls(tmp_path: Path) -> None:
    """A device call runs only the checks it names and starts none past its budget; a later
    call's results join the earlier ones' (a rerun check replaced), and the docs take them in
    unless the machine or torch build differs (then the old results go whole)."""
    from bench.gpu_bench import Sections

    machine = {"gpu": "G", "torch": "t", "cpus": 16}
    out, ran = tmp_path / "gpu.json", []
    first = Sections(out, machine, only={"a", "b"}, deadline=time.monotonic() + 60)
    for name in ("a", "b", "c"):
        first.run(name, lambda n=name: ran.append(n) or n)  # type: ignore[func-returns-value]
    late = Sections(out, machine, only=set(), deadline=time.monotonic() - 1)
    late.run("d", lambda: ran.append("d"))  # type: ignore[func-returns-value]
    again = Sections(out, machine, only={"b"}, deadline=time.monotonic() + 60)
    again.run("b", lambda: "b2")
    assert ran == ["a", "b"]  # c not named, d past the budget
    saved = json.loads(out.read_text())
    assert (saved["a"]["value"], saved["b"]["value"]) == ("a", "b2") and "c" not in saved and "d" not in saved

    target = tmp_path / "docs.json"
    target.write_text(json.dumps({"machine": machine, "old": {"ok": True}, "b": {"ok": False}}))
    gpu_docs.merge(out, target)
    merged = json.loads(target.read_text())
    assert merged["old"] == {"ok": True} and merged["b"]["value"] == "b2"
    target.write_text(json.dumps({"machine": {**machine, "torch": "other"}, "old": {"ok": True}}))
    gpu_docs.merge(out, target)
    assert "old" not in json.loads(target.read_text())

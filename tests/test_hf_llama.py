"""A Hugging Face model under Unicron (examples/hf-llama): LlamaForCausalLM from a configuration
built in code, trained by the DDP port's plain torchrun + DDP script and by its port. The port
trains on the same samples in the same order as the original (bit for bit under torchrun);
through the real stack it loses a worker mid-step (gradient buckets in flight) and then a whole
node, recovers both in place, and ends with the parameters and optimizer state of the
failure-free original (within float32's rounding: the model's norms compute in float32), every
step trained on exactly its global batch. The same Llama sharded with FSDP2 inside each replica
(train_fsdp.py) loses a whole replica, ends the same way, and exports the model whole."""

from __future__ import annotations

import functools
import importlib.metadata
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from unicron.control.launch.localcluster import LocalCluster
from unicron.train.checkpoint import load_latest

from .conftest import ROOT
from .test_ddp_port import assert_same_training, ddp_state, distance, run_port, torchrun
from .test_live_cluster import (
    assert_every_incident_closed,
    assert_ledger_exact,
    finish_and_settle,
    story_of,
    traced_task,
)
from .test_live_replicas import replicas_per_node, whole

LlamaForCausalLM = pytest.importorskip(
    "transformers", reason="the hf extra (make test installs it)"
).LlamaForCausalLM

LLAMA = ROOT / "examples" / "hf-llama"
# The tasks' run.preload: their workers are forked from a server that imported Transformers'
# Llama (docs/warm-start.md).
PRELOAD = ["transformers.models.llama.modeling_llama"]


@pytest.fixture
def ddp(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[..., dict[str, Any]]:
    """``ddp(workers, iterations)``: train_ddp.py's final state, failure-free (cached by its inputs)."""
    cache = getattr(request.config, "cache", None)
    folder = Path(cache.mkdir("unicron-ddp")) if cache is not None else tmp_path
    return functools.partial(ddp_state, folder, example=LLAMA, packages=("transformers",))


@pytest.mark.timeout(300)
def test_the_llama_port_trains_exactly_as_its_ddp_original_and_its_export_opens_and_starts_a_run(
    tmp_path: Path, ddp: Callable[..., dict[str, Any]]
) -> None:
    """Under torchrun the port ends bit for bit where its DDP original does. It writes its final
    model with save_pretrained (rank 0 alone, as the task ends): from_pretrained opens it, equal
    to the final checkpoint's; a run given that folder starts from those weights (at a learning
    rate of 0, AdamW's decay included, it ends on them)."""
    export = tmp_path / "exported"
    args = ["--dtype", "float64", "--export", str(export)]
    torchrun("train_unicron.py", 2, 24, tmp_path / "unicron", *args, example=LLAMA)
    port = load_latest(tmp_path / "unicron")
    assert port is not None
    assert_same_training(port, ddp(2, 24), exact=True)
    assert sorted(p.name for p in export.iterdir()) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
    ]
    opened = LlamaForCausalLM.from_pretrained(export, dtype="auto").state_dict()
    assert all(torch.equal(opened[k], v) for k, v in port["model"].items())
    again = ["--dtype", "float64", "--pretrained", str(export), "--lr", "0"]
    torchrun("train_unicron.py", 1, 2, tmp_path / "second", *again, example=LLAMA)  # one worker opens it
    resumed = load_latest(tmp_path / "second")
    assert resumed is not None and resumed["step"] == 2
    assert all(torch.equal(resumed["model"][k], v) for k, v in port["model"].items())


@pytest.mark.timeout(600)
def test_the_llama_port_recovers_a_killed_worker_and_a_lost_node_in_place(
    tmp_path: Path, ddp: Callable[..., dict[str, Any]]
) -> None:
    # As many steps as the sharded test's: one failure-free original (4 workers, 24 steps) for both.
    iterations = 24
    faults = [
        {"action": "kill_in_backward", "rank": 1, "step": 8, "generation": 0},
        # The other node's agent, with its workers: rank 2 is there whether the first recovery's
        # regrow (a newcomer beside rank 0, rank 3) has come by step 16 or not.
        {"action": "lose_node", "rank": 2, "step": 16, "generation": 0},
    ]
    exported = tmp_path / "exported"  # written as the task ends: before it is reported done
    events, rows = run_port(
        tmp_path,
        faults,
        iterations,
        "--dtype",
        "float64",
        "--export",
        str(exported),
        example=LLAMA,
        preload=PRELOAD,
    )
    kinds = [e["kind"] for e in events]
    story = story_of([e for e in events if e["kind"] not in ("throughput_measured", "straggler")])
    assert kinds.count("task_launch") == 1, story  # nothing restarted from a checkpoint
    # (The node's loss is usually not reported as injected: its agent dies before it relays it.)
    injected = {e["detail"]["action"] for e in events if e["kind"] == "fault_injected"}
    assert {"kill_in_backward"} <= injected <= {"kill_in_backward", "lose_node"}, story
    incidents = [e["detail"]["kind"] for e in events if e["kind"] == "incident"]
    assert {"exited_abnormally", "node_lost"} <= set(incidents), story
    assert kinds.count("in_process_recovery") == len(incidents), story
    assert_every_incident_closed(events)
    # The lost node's ranks, numbered in the generation it left (its step in flight may lack
    # their ledger lines).
    (loss,) = [e["id"] for e in events if e["kind"] == "incident" and e["detail"]["kind"] == "node_lost"]
    (left,) = [
        e["detail"] for e in events if e["kind"] == "in_process_recovery" and e["detail"]["incident"] == loss
    ]
    world = len(left["failed"]) + len(left["survivors"])
    assert_ledger_exact(rows, iterations, frozen=frozenset(left["failed"]), world=world)
    final = load_latest(tmp_path / "cluster" / "checkpoints" / "port")
    assert final is not None
    assert_within_float32(final, ddp(4, iterations))
    opened = LlamaForCausalLM.from_pretrained(exported, dtype="auto").state_dict()
    assert all(torch.equal(opened[k], v) for k, v in final["model"].items())


@pytest.mark.timeout(600)
def test_the_llama_sharded_with_fsdp2_recovers_a_lost_replica_in_place_and_exports_whole(
    tmp_path: Path, ddp: Callable[..., dict[str, Any]]
) -> None:
    """train_fsdp.py as a task of two replicas of two ranks, the Llama sharded by FSDP2 inside
    each: the node of rank 0's replica is lost mid-run, the other replica, renumbered 0 and 1,
    trains on alone in place (the same global batch), and the task ends where the DDP original
    does, every step trained on exactly its global batch; the exported model is the final
    checkpoint's, gathered whole by the survivors."""
    trace, iterations, exported = tmp_path / "trace.jsonl", 24, tmp_path / "exported"
    fault = [{"action": "lose_node", "rank": 0, "step": 10, "generation": 0}]
    program = ["python", str(LLAMA / "train_fsdp.py"), "--dtype", "float64", "--export", str(exported)]
    lines = f"  replica_size: 2\n  faults: {json.dumps(fault)}\n  preload: {json.dumps(PRELOAD)}\n"
    spec = traced_task(trace, "{2: 1.9e9, 4: 3.5e9}", iterations, 0.0, lines, name="llama", program=program)
    with LocalCluster(tmp_path / "cluster", nodes=2, slots=2) as cluster:
        cluster.submit(spec)
        cluster.wait(lambda: cluster.task("llama")["step"] >= 1, 240, "the task to train")
        assert whole(replicas_per_node(cluster.get("/v1/workers")))  # a replica per node
        events, rows = finish_and_settle(cluster, trace, "llama")
    story = story_of([e for e in events if e["kind"] not in ("throughput_measured", "straggler")])
    assert [e["kind"] for e in events].count("task_launch") == 1, story  # never relaunched
    (left,) = [e["detail"] for e in events if e["kind"] == "in_process_recovery"]
    assert left["failed"] == [0, 1] and left["survivors"] == [2, 3], story  # the replica, whole
    assert_every_incident_closed(events)
    shards = [r for r in rows if r["what"] == "sharded"]
    assert shards and all(r["parameters"] < r["of"] for r in shards)  # each rank holds a part
    assert_ledger_exact(rows, iterations, frozen=frozenset({0, 1}), world=4, replica_size=2)
    final = load_latest(tmp_path / "cluster" / "checkpoints" / "llama")
    assert final is not None
    assert_within_float32(final, ddp(4, iterations))
    opened = LlamaForCausalLM.from_pretrained(exported, dtype="auto").state_dict()
    assert opened.keys() == final["model"].keys()
    assert all(torch.equal(opened[k], v) for k, v in final["model"].items())


def relative(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    """How far ``got`` is from ``want``, all tensors together, relative to ``want``'s size."""
    return distance(got, want) / float(torch.cat([v.double().flatten() for v in want.values()]).norm())


def assert_within_float32(final: dict[str, Any], original: dict[str, Any]) -> None:
    """The recovered run ends where the failure-free original does, within what float32 rounding
    makes of a float64 run of this model. Llama's RMSNorm, its eager attention's softmax and its
    rotary angles compute in float32 whatever the model's dtype, so a difference at float64's
    rounding (a recovery sums the same gradients in another order) becomes one at float32's at
    the next step, and training carries it on: measured 3e-9 of the parameters' size and 1.5e-7
    of Adam's moments' after 40 steps here (the tiny GPT, float64 throughout: 3e-12). A sample
    lost or counted twice is the ledger's to catch; a recovery that weighted it wrongly would end
    far outside the bound: the DDP original with one micro-batch of step 24 (or 8) weighted twice
    ends 3.6e-3 (9.2e-3) of the parameters' size and 8.6e-2 (7.9e-2) of the moments' away from its
    right run (measured once, 2026-12-04)."""
    assert final["step"] == original["step"] and final["extras"]["scheduler"] == original["scheduler"]
    moments = [
        ({k: s[k] for k in ("exp_avg", "exp_avg_sq")}, original["optimizer"]["state"][i])
        for i, s in final["optimizer"]["state"].items()
    ]
    apart = {
        "parameters": relative(final["model"], original["model"]),
        "moments": max(relative(got, {k: want[k] for k in got}) for got, want in moments),
    }
    print(f"recovered vs the original, relative: {apart}")
    assert max(apart.values()) < 1e-5, apart


def test_the_docs_name_the_transformers_release_tried() -> None:
    release = ".".join(importlib.metadata.version("transformers").split(".")[:2])
    assert (
        f"`LlamaForCausalLM` (Transformers {release})" in (ROOT / "docs" / "training-library.md").read_text()
    )

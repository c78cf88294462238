"""Checkpoints of a sharded replica through torch.distributed.checkpoint, on real gloo
processes: two ranks write their shards; the checkpoint reads back whole (the form an unsharded
run loads, equal to the state gathered whole) and loads into three shards (resharded) and into
an unsharded model, exact; a replica loads its in-memory copy only where all its ranks have
one; a corrupted shard is refused by its digest at any shard count, and a
metadata file that would run code is refused without running it."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import shutil
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.utils._pytree import tree_map

from unicron.train import checkpoint, dcpfiles, shardedcheckpoint
from unicron.train.rowdigest import layout_digest
from unicron.train.state import TrainState

from .spawned import run_ranks


class Counter:
    def __init__(self) -> None:
        self.count = 0

    def state_dict(self) -> dict[str, Any]:
        return {"count": self.count, "history": [0.5, 0.25]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.count = int(state["count"])


def build(sharded: bool) -> TrainState:
    torch.manual_seed(0)
    # 7 and 5 rows: shards of uneven size at 2 and 3 ranks.
    model = torch.nn.Sequential(torch.nn.Linear(4, 7), torch.nn.Tanh(), torch.nn.Linear(7, 5)).double()
    if sharded:
        mesh = DeviceMesh.from_group(dist.group.WORLD, "cpu")
        for layer in (model[0], model[2]):
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
    return TrainState(model, optimizer, {"counter": Counter()})


def whole_state(train: TrainState) -> dict[str, Any]:
    """The training state with every sharded tensor gathered whole (a collective)."""
    parts = {"model": train.model.state_dict(), "optimizer": train.optimizer.state_dict()}
    parts["extras"] = {name: obj.state_dict() for name, obj in train.extras.items()}
    return tree_map(lambda v: v.full_tensor() if isinstance(v, DTensor) else v, parts)  # type: ignore[no-any-return]


def plain(state: dict[str, Any]) -> Any:
    """Tensors as lists, to cross a queue."""
    if isinstance(state, torch.Tensor):
        return state.tolist()
    if isinstance(state, dict):
        return {k: plain(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return [plain(v) for v in state]
    return state


def _rank(rank: int, port: int, out: mp.Queue, world: int, folder: str, load: bool, hosts: list[str]) -> None:  # type: ignore[type-arg]
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0, timedelta(seconds=60))  # type: ignore[attr-defined]
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    train = build(sharded=True)
    result: Any
    if not load:  # train two steps, save
        for _ in range(2):
            train.model(torch.randn(3, 4, dtype=torch.float64)).pow(2).sum().backward()
            train.optimizer.step()
            train.optimizer.zero_grad()
        train.extras["counter"].count = 2  # type: ignore[attr-defined]
        state = shardedcheckpoint.state_of(train, 2, 2, task="t", generation=0, world_size=2)
        shardedcheckpoint.save(Path(folder), 2, state, commit=rank == 0)
        result = plain(whole_state(train))
    else:  # load, resharded at another world size; each rank has its node's in-memory folder, if any
        host = Path(hosts[rank]) if hosts else None
        found = shardedcheckpoint.restore_nearest(train, Path(folder), host)
        full = plain(whole_state(train))
        digest = layout_digest(train.model.state_dict(), shardedcheckpoint.gather_over_replica)
        result = None if found is None else (found.state["step"], found.source, full, found.skipped, digest)
    out.put((rank, result))
    dist.barrier()
    dist.destroy_process_group()


def run(world: int, folder: Path, load: bool = True, hosts: tuple[Path, ...] = ()) -> dict[int, Any]:
    return run_ranks(_rank, world, world, str(folder), load, [str(h) for h in hosts])


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    folder = tmp_path_factory.mktemp("ckpt")
    results = run(2, folder, load=False)
    assert results[0] == results[1]
    return folder, results[0]


def test_a_sharded_checkpoint_reads_back_whole_and_loads_into_other_shard_counts(
    saved: tuple[Path, dict[str, Any]],
) -> None:
    folder, whole = saved
    assert sorted(p.name for p in folder.iterdir()) == ["latest", "step-00000002.dcp"]
    read = checkpoint.load_latest(folder)
    assert read is not None and read["step"] == 2 and read["world_size"] == 2
    assert plain({k: read[k] for k in ("model", "optimizer", "extras")}) == whole
    # Unsharded: loaded whole by one process, as an unsharded task resumes.
    found = checkpoint.load_nearest(folder, None)
    assert found is not None and found.source == "persistent"
    one = build(sharded=False)
    one.load_state_dict(found.state, whole=True)
    assert plain(whole_state(one)) == whole
    # Resharded into three ranks (rows 7 and 5 split 3/3/1 and 2/2/1).
    loaded = run(3, folder)
    assert {r[0] for r in loaded.values()} == {2} and all(r[2] == whole for r in loaded.values())
    assert all(r[3] == () for r in loaded.values())
    # A whole-state checkpoint (an unsharded run's) loads into the shards of a replica too.
    unsharded = folder.parent / "unsharded"
    checkpoint.save(unsharded, 2, checkpoint.state_of(one, 2))
    assert all(r[2] == whole and r[1] == "persistent" for r in run(2, unsharded).values())
    # The parameters' digest is the same in three shards as whole (what a finished task reports).
    assert {r[4] for r in loaded.values()} == {layout_digest(one.model.state_dict())}


def test_the_replica_loads_from_node_memory_only_where_all_its_ranks_have_the_copy(
    saved: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    source, whole = saved
    node, empty = tmp_path / "node-a", tmp_path / "node-b"
    shutil.copytree(source / "step-00000002.dcp", node / "step-00000002.dcp")
    empty.mkdir()
    together = run(2, source, hosts=(node, node))  # a replica on one node: its memory copy
    assert [r[1] for r in together.values()] == ["host_memory"] * 2
    assert all(r[2] == whole for r in together.values())
    split = run(2, source, hosts=(node, empty))  # across two nodes: only the persistent one is common
    assert [r[1] for r in split.values()] == ["persistent"] * 2
    assert all(r[2] == whole for r in split.values())


def test_a_corrupt_checkpoint_is_refused(saved: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    import shutil

    source, _ = saved
    folder = tmp_path / "copy"
    shutil.copytree(source, folder)
    # Flip the lowest bit of a weight where a shard file holds it: readable, but not what was saved.
    whole = dcpfiles.read_whole(folder / "step-00000002.dcp")
    row = whole["model"]["0.weight"][0].numpy().tobytes()
    shards = [p for p in (folder / "step-00000002.dcp").iterdir() if p.suffix == ".distcp"]
    shard = next(p for p in shards if row in p.read_bytes())
    data = bytearray(shard.read_bytes())
    data[data.index(row)] ^= 0x01
    shard.write_bytes(bytes(data))
    assert checkpoint.load_nearest(folder, None) is None
    with pytest.raises(dcpfiles.CheckpointCorrupt, match="digest"):
        dcpfiles.read_whole(folder / "step-00000002.dcp")
    # Resharded, the replica's ranks refuse it together (and find nothing older).
    assert run(3, folder) == {0: None, 1: None, 2: None}


class Hostile:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, ("touch /tmp/unicron-dcp-pwned",))


def test_metadata_that_would_run_code_is_refused(saved: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    folder = tmp_path / "copy"
    shutil.copytree(saved[0], folder)
    (folder / "step-00000002.dcp" / ".metadata").write_bytes(pickle.dumps(Hostile()))
    marker = Path("/tmp/unicron-dcp-pwned")
    marker.unlink(missing_ok=True)
    found = checkpoint.load_nearest(folder, None)
    assert found is None and not marker.exists()

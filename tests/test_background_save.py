"""A sharded replica's checkpoint written in the background (``train/backgroundsave.py``), on
real gloo processes: training goes on while it is written, and the checkpoint holds the state of
the step it was taken at; storage that refuses it, and a commit its writer cannot confirm,
leave no checkpoint behind and raise on every rank only when the replica commits."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from unicron.train import checkpoint, shardedcheckpoint
from unicron.train.backgroundsave import BackgroundSave
from unicron.train.checkpoint import CheckpointWriteError
from unicron.train.fencing import CommitRefused, Standing

from .spawned import run_ranks
from .test_live_storage import small_tmpfs
from .test_sharded_checkpoint import build, plain, whole_state


def train_step(train: Any) -> None:
    train.model(torch.randn(3, 4, dtype=torch.float64)).pow(2).sum().backward()
    train.optimizer.step()
    train.optimizer.zero_grad()


def refused() -> None:
    raise CommitRefused(Standing.SUPERSEDED, 0, 3)


def _rank(rank: int, port: int, out: mp.Queue, folder: str, full: str) -> None:  # type: ignore[type-arg]
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timedelta(seconds=60))  # type: ignore[attr-defined]
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    saver = dist.new_group(backend="gloo")
    train, commit = build(sharded=True), rank == 0
    for _ in range(2):
        train_step(train)
    state = shardedcheckpoint.state_of(train, 2, 2, task="t", generation=0, world_size=2)
    at_two = plain(whole_state(train))
    if commit:  # a write of step 1 that its writer abandoned (it failed, or left the task)
        (Path(folder) / "step-00000001.dcp.tmp").mkdir(parents=True)
    written = BackgroundSave.start(Path(folder), 2, state, commit, saver)
    train_step(train)  # training goes on (in place) while the copy is written
    at_three = plain(whole_state(train))
    path = written.finish()
    outcomes: list[str] = []
    # Storage that cannot hold it (a 64 KiB tmpfs), then a commit the writer cannot confirm.
    state = shardedcheckpoint.state_of(train, 3, 2, task="t", generation=0, world_size=2)
    for directory, confirm in ((Path(full), None), (Path(folder), refused)):
        try:
            BackgroundSave.start(directory, 3, state, commit, saver, confirm).finish()
            outcomes.append("committed")
        except CheckpointWriteError:
            outcomes.append("storage")
        except CommitRefused:
            outcomes.append("refused")
    out.put((rank, (str(path), at_two, at_three, outcomes)))
    dist.barrier()
    dist.destroy_process_group()


def test_training_goes_on_while_the_checkpoint_is_written_and_it_holds_its_own_step(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    with contextlib.contextmanager(small_tmpfs)(tmp_path / "full") as full:
        results = run_ranks(_rank, 2, str(folder), str(full))
        assert not any(full.iterdir()), "a write the storage refused left files behind"
    (path, at_two, at_three, outcomes), other = results[0], results[1]
    assert other[1:] == (at_two, at_three, outcomes)
    assert at_two != at_three  # the step after it changed the parameters in place
    # The committed checkpoint is step 2's, although step 3 ran while it was written.
    assert path == str(folder / "step-00000002.dcp")
    read = checkpoint.load_latest(folder)
    assert read is not None and read["step"] == 2
    assert plain({k: read[k] for k in ("model", "optimizer", "extras")}) == at_two
    # Each rank raised, and neither the refused storage nor the refused commit left a checkpoint;
    # the commit of step 2 removed the abandoned attempt at step 1.
    assert outcomes == ["storage", "refused"]
    assert sorted(p.name for p in folder.iterdir()) == ["latest", "step-00000002.dcp"]

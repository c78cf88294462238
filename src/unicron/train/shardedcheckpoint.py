"""Checkpoints of a sharded replica, through ``torch.distributed.checkpoint`` (DCP).

Each rank of the writing replica writes its own shard (no rank gathers the model), and DCP's
metadata says which rows of which tensor each file holds, so the checkpoint loads at any shard
count: into another replica size's shards (DCP reshards as it reads), or whole (``read_whole``,
what an unsharded task and the tests read). The model and optimizer states are the ones
``torch.distributed.checkpoint.state_dict`` defines (optimizer state keyed by parameter name,
initialised before a load so that a fresh optimizer has somewhere to load into).

Written as ``step-NNNNNNNN.dcp.tmp`` and renamed to ``step-NNNNNNNN.dcp`` once every rank's files
and the metadata are in (DCP's save returns on every rank only after the coordinator wrote the
metadata), then ``latest`` points at it: a torn checkpoint is never taken for one. The digest
saved with it (``rowdigest.layout_digest``) is checked after every load, at any shard count.

Read back without running code in the reader: ``dcpfiles.py``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from unicron.train import checkpoint, dcpfiles
from unicron.train.checkpoint import CheckpointWriteError, Restored
from unicron.train.dcpfiles import SUFFIX, CheckpointCorrupt, path_for
from unicron.train.rowdigest import Leaves, layout_digest
from unicron.train.state import TrainState

META = ("step", "data_position", "task", "generation", "world_size", "replica_size", "layout_digest")


def gather_over_replica(mine: Leaves) -> list[Leaves]:
    """Every rank's row hashes, over the replica's group (torch.distributed's default group)."""
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    return every


def state_of(train: TrainState, step: int, replica_size: int, **where: Any) -> dict[str, Any]:
    """What every rank of the writing replica passes to ``save``: its shards of the model and
    optimizer (DCP's form), the registered objects, and where and when it was taken, with the
    digest of the whole (a collective over the replica)."""
    model, optimizer = get_state_dict(train.model, train.optimizer)
    parts: dict[str, Any] = {"model": model, "optimizer": optimizer}
    if train.extras:
        parts["extras"] = {name: obj.state_dict() for name, obj in train.extras.items()}
    digest = layout_digest(parts, gather_over_replica)
    meta = {"step": step, "data_position": {"step": step}, "replica_size": replica_size, **where}
    return {**parts, **meta, "layout_digest": digest}


def save(
    directory: Path,
    step: int,
    state: dict[str, Any],
    commit: bool,
    keep: int = 3,
    confirm: Callable[[], None] | None = None,
) -> Path:
    """Write the replica's shards of ``state`` for ``step`` (every rank of the replica calls
    this); the rank that ``commit``s renames it into place, points ``latest`` at it and prunes
    to the newest ``keep``. Storage that refuses any part raises ``CheckpointWriteError`` on
    every rank (DCP gathers each rank's failure), leaving the previous checkpoint as it was.
    Every rank calls ``confirm`` before the commit (the replica agrees on its answer:
    ``fencing.Fence.confirm_in_replica``); what it raises leaves no folder. The same write in
    the background: ``backgroundsave.py``."""
    try:
        tmp = ready(directory, step, commit)
        dcp_save(state, storage_writer=FileSystemWriter(tmp))
        return committed(directory, step, commit, keep, confirm)
    except WRITE_ERRORS as exc:
        raise discarded(directory, step, commit, exc) from exc


WRITE_ERRORS = (OSError, RuntimeError, CheckpointException)  # what storage that refuses raises


def ready(directory: Path, step: int, commit: bool) -> Path:
    """The folder the replica writes ``step`` into (under a ``.tmp`` name), empty before any
    rank writes into it (a collective over the replica)."""
    tmp = _tmp(path_for(directory, step))
    if commit:
        directory.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)  # a torn attempt at the same step
    dist.barrier()
    return tmp


def committed(
    directory: Path, step: int, commit: bool, keep: int, confirm: Callable[[], None] | None
) -> Path:
    """Once every rank's files and DCP's metadata are in: ``confirm`` (every rank), then the
    committing rank renames the folder into place, points ``latest`` at it and prunes to the
    newest ``keep`` (and any older torn attempt)."""
    target = path_for(directory, step)
    _confirmed(confirm, _tmp(target) if commit else None)
    if not commit:
        return target
    shutil.rmtree(target, ignore_errors=True)
    os.replace(_tmp(target), target)
    checkpoint.point_latest(directory, target)
    for old in sorted(p for p in directory.glob(f"step-*{SUFFIX}") if p.is_dir())[:-keep]:
        shutil.rmtree(old, ignore_errors=True)  # best effort: the new one is in place
    for torn in directory.glob(f"step-*{SUFFIX}.tmp"):
        if torn.name < target.name:  # an attempt abandoned (its writer failed or left)
            shutil.rmtree(torn, ignore_errors=True)
    return target


def discarded(directory: Path, step: int, commit: bool, exc: BaseException) -> CheckpointWriteError:
    """The error for a write that failed, its partial folder removed (by the committing rank)."""
    target = path_for(directory, step)
    if commit:
        shutil.rmtree(_tmp(target), ignore_errors=True)
        with contextlib.suppress(OSError):
            (directory / (checkpoint.LATEST + ".tmp")).unlink(missing_ok=True)
    return CheckpointWriteError(f"checkpoint storage failed writing {target}: {exc}")


def _tmp(target: Path) -> Path:
    return target.with_name(target.name + ".tmp")


def _confirmed(confirm: Callable[[], None] | None, tmp: Path | None) -> None:
    """Run ``confirm`` before a commit; what it raises removes the written folder (``tmp``: the
    committing rank's)."""
    if confirm is None:
        return
    try:
        confirm()
    except BaseException:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise


def load(train: TrainState, path: Path) -> dict[str, Any]:
    """Load the checkpoint at ``path`` into a sharded ``train`` (every rank of the replica
    calls this; DCP reads each rank's rows, whatever shard count wrote them); returns where and
    when it was taken. Raises ``CheckpointCorrupt`` when the loaded state is not the one saved."""
    model, optimizer = get_state_dict(train.model, train.optimizer)  # fresh moments: initialised
    meta = {**dict.fromkeys(META), "data_position": {"step": None}}  # filled in as saved
    target: dict[str, Any] = {"model": model, "optimizer": optimizer, **meta}
    if train.extras:
        target["extras"] = {name: obj.state_dict() for name, obj in train.extras.items()}
    try:
        dcp_load(target, storage_reader=dcpfiles.SafeReader(path), planner=dcpfiles.SafeLoadPlanner())
    except CheckpointException as exc:  # a BaseException: every rank gets every rank's failure
        raise CheckpointCorrupt(f"{path} could not be read: {exc}") from None
    parts = {k: target[k] for k in ("model", "optimizer", "extras") if k in target}
    if layout_digest(parts, gather_over_replica) != target["layout_digest"]:
        raise CheckpointCorrupt(f"{path} does not match its digest")
    set_state_dict(train.model, train.optimizer, model_state_dict=model, optim_state_dict=optimizer)
    for name, obj in train.extras.items():
        obj.load_state_dict(target["extras"][name])
    return {k: target[k] for k in META}


def restore_nearest(train: TrainState, persistent: Path, host: Path | None) -> Restored | None:
    """Load the newest intact checkpoint into a sharded ``train``, from the nearest tier, as
    ``checkpoint.load_nearest`` does for a whole model; every rank of the replica calls this,
    and they load the same checkpoint together: the newest that all of them can see (a tier in
    node memory differs between nodes), passing over one that fails any rank."""
    found = checkpoint.candidates(persistent, host)
    mine = {(step, order, path.name) for step, order, _, path in found}
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    common = set.intersection(*every)
    skipped: list[tuple[str, str]] = []
    for step, order, source, path in found:
        if (step, order, path.name) not in common:
            continue
        try:
            meta = load(train, path) if path.is_dir() else _load_whole(train, path)
            return Restored(meta, source, path, tuple(skipped))
        except CheckpointCorrupt as exc:
            skipped.append((str(path), str(exc)[:200]))
    return None


def _load_whole(train: TrainState, path: Path) -> dict[str, Any]:
    """A whole-state checkpoint (``checkpoint.save``: written by an unsharded run) into the
    replica's shards; the ranks agree on whether every one of them read it intact."""
    state, why = checkpoint.read_checked(path)
    ok = torch.tensor([state is not None], dtype=torch.int64)
    dist.all_reduce(ok, dist.ReduceOp.MIN)
    if state is None or not bool(ok[0]):
        raise CheckpointCorrupt(f"{path}: {why or 'unreadable on another rank of the replica'}")
    train.load_state_dict(state, whole=True)
    return state

"""Checkpoints: the training state (model, optimizer, registered objects), step and data
position, written atomically by rank 0."""

from __future__ import annotations

import contextlib
import io
import os
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import torch

from unicron.core.limits import MAX_SKIPPED
from unicron.core.protocol import RestoredReport
from unicron.core.workerenv import host_checkpoint_dir
from unicron.train.rowdigest import layout_digest
from unicron.train.state import TrainState, digest_of, digest_parts

LATEST = "latest"


def path_for(directory: Path, step: int) -> Path:
    return directory / f"step-{step:08d}.pt"


def state_of(train: TrainState, step: int, **where: Any) -> dict[str, Any]:
    """What a checkpoint holds: the training state (model, optimizer, registered objects), step,
    data position (the stream is addressed by step), where it was taken (task, generation, world
    size), the parameters' digest and the whole state's (``state_digest``), checked when it is
    loaded."""
    parts = train.state_dict()  # whole: a sharded model's checkpoints are shardedcheckpoint's
    return {
        **parts,
        "step": step,
        "data_position": {"step": step},
        **where,
        "digest": digest_of(parts["model"]),
        "state_digest": digest_parts(parts),
    }


class CheckpointWriteError(OSError):
    """The checkpoint storage could not take a checkpoint (full, read-only, gone). torch.save on
    a full disk raises a RuntimeError that names no disk ("unexpected pos ..."); this names the
    storage, so that the fault is classified as the storage's and blamed on no node."""


def save(
    directory: Path,
    step: int,
    state: dict[str, Any],
    keep: int = 3,
    confirm: Callable[[], None] | None = None,
) -> Path:
    """Write ``state`` for ``step`` and point ``latest`` at it; keep the newest ``keep``. A
    storage that refuses any part of it raises ``CheckpointWriteError`` and keeps no partial file
    (the previous checkpoint and pointer stay as they were). ``confirm`` is called once the file
    is written, before it is committed: what it raises (``fencing.CommitRefused``) leaves no file."""
    target = path_for(directory, step)
    tmp, pointer = target.with_suffix(".tmp"), directory / (LATEST + ".tmp")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        torch.save(state, tmp)
        if confirm is not None:
            try:
                confirm()
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
        os.replace(tmp, target)
        point_latest(directory, target)
    except (OSError, RuntimeError) as exc:
        for torn in (tmp, pointer):  # a torn file must not fill the store further
            with contextlib.suppress(OSError):
                torn.unlink(missing_ok=True)
        raise CheckpointWriteError(f"checkpoint storage failed writing {target}: {exc}") from exc
    for old in sorted(directory.glob("step-*.pt"))[:-keep]:
        with contextlib.suppress(OSError):  # pruning is best effort: the new file is in place
            old.unlink(missing_ok=True)
    return target


def point_latest(directory: Path, target: Path) -> bool:
    """Point ``latest`` at ``target`` unless it already names a later step: the pointer never
    goes back. A writer cut off from its task (its host partitioned, its generation left behind)
    that saves a step the others have passed does not commit it; whether it pointed is returned.
    (Resuming never depends on the pointer: ``load_nearest`` takes the newest intact copy.)"""
    pointer, latest = directory / (LATEST + ".tmp"), directory / LATEST
    with contextlib.suppress(OSError, ValueError):
        if _step_of(Path(latest.read_text().strip())) > _step_of(target):
            return False
    pointer.write_text(target.name)
    os.replace(pointer, latest)
    return True


def host_dir(persistent: Path, node: str, root: str | None = None) -> Path | None:
    """The node's in-memory checkpoint folder (``core.workerenv.host_checkpoint_dir``); None
    when the host has no RAM-backed folder there."""
    path = host_checkpoint_dir(persistent, node, root)
    return path if path.parents[2].is_dir() else None


@dataclass(frozen=True)
class Restored:
    """The state a worker resumes from, where it came from, and the newer copies passed over."""

    state: dict[str, Any]
    source: str  # "host_memory" | "persistent"
    path: Path
    skipped: tuple[tuple[str, str], ...]  # (file, why) of newer copies not used

    def report(self, task: str, generation: int, rank: int) -> RestoredReport:
        return RestoredReport(
            task=task,
            generation=generation,
            rank=rank,
            step=int(self.state["step"]),
            source=self.source,
            path=str(self.path),
            skipped=list(self.skipped[:MAX_SKIPPED]),  # the newest (more is a folder of wrecks)
        )


def read(source: Path | BinaryIO) -> dict[str, Any]:
    """A saved state, unpickled with ``weights_only``: tensors, numbers, strings and containers
    only. A checkpoint or a peer's transfer can run no code in the worker that reads it (anyone
    who can write the shared directory could otherwise run code in every worker). Tensors are
    read into host memory: the model's ``load_state_dict`` copies them to wherever it lives (a
    state saved from a GPU loads on a worker without one, and no GPU memory is taken twice)."""
    state: dict[str, Any] = torch.load(source, weights_only=True, map_location="cpu")
    return state


def check_plain(name: str, state: dict[str, Any]) -> None:
    """Refuse a registered object whose state ``read`` could not load back (an object of the
    user's own class in it), when it is registered rather than at the first restore."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    try:
        read(buffer)
    except pickle.UnpicklingError as exc:
        raise TypeError(
            f"session.register({name!r}, ...): its state_dict() holds something other than tensors, "
            "numbers, strings, lists and dicts, which checkpoints do not load (they run no code): "
            f"return plain values from state_dict() ({_refused_global(exc)})"
        ) from None


def _refused_global(exc: Exception) -> str:
    """The line of torch's refusal that names what it would not load."""
    lines = str(exc).splitlines()
    return next((line.strip() for line in lines if "GLOBAL" in line), lines[0] if lines else "")[:160]


def load_nearest(persistent: Path, host: Path | None) -> Restored | None:
    """The newest intact checkpoint, from the nearest tier: the node's in-memory copy before the
    persistent one of the same step; a copy that cannot be read or does not match the digest
    saved with it is passed over (and named in ``skipped``) for the next newest, in either
    tier, down to the oldest kept. A sharded replica's checkpoint (``shardedcheckpoint.py``) is
    read whole."""
    skipped: list[tuple[str, str]] = []
    for _, _, source, path in candidates(persistent, host):
        state, why = read_checked(path)
        if state is not None:
            return Restored(state, source, path, tuple(skipped))
        skipped.append((str(path), why))
    return None


def candidates(persistent: Path, host: Path | None) -> list[tuple[int, int, str, Path]]:
    """The checkpoints in both tiers, newest first, the nearer tier first at the same step:
    (step, tier order, tier, path), whole-state files and sharded checkpoints alike."""
    tiers = [("host_memory", host), ("persistent", persistent)]
    found = [
        (_step_of(path), order, source, path)
        for order, (source, folder) in enumerate(tiers)
        if folder is not None and folder.is_dir()
        for path in [*folder.glob("step-*.pt"), *filter(_committed, folder.glob("step-*.dcp"))]
        if path.stem.removeprefix("step-").isdigit()
    ]
    return sorted(found, key=lambda f: (-f[0], f[1]))


def _committed(folder: Path) -> bool:
    """A sharded checkpoint's folder that was committed: DCP writes its metadata last."""
    return (folder / ".metadata").is_file()


def read_checked(path: Path) -> tuple[dict[str, Any] | None, str]:
    """The state saved at ``path`` if it is intact, else None and why not."""
    if path.is_dir():
        return _read_sharded_checked(path)
    try:
        state = read(path)
    except Exception as exc:  # torn, truncated, foreign, or carrying code: not a usable copy
        return None, f"unreadable: {type(exc).__name__}"
    if not _intact(state):
        return None, "does not match its digest"
    return state, ""


def _read_sharded_checked(path: Path) -> tuple[dict[str, Any] | None, str]:
    # The readers and writers of sharded checkpoints (``dcpfiles``, ``shardedcheckpoint``,
    # ``backgroundsave``) are imported where a sharded replica first uses them, here and in
    # ``load_latest``, ``saving.py`` and ``session.py``: they load torch.distributed.checkpoint,
    # which the workers of a model that is not sharded never need (a third of a CPU-second of each
    # worker's start here).
    from unicron.train import dcpfiles

    try:
        return dcpfiles.read_whole(path), ""
    except dcpfiles.CheckpointCorrupt as exc:
        return None, str(exc)[:200]
    except Exception as exc:  # a DCP folder that is not a checkpoint of ours
        return None, f"unreadable: {type(exc).__name__}"


def _step_of(path: Path) -> int:
    return int(path.stem.removeprefix("step-"))


def _intact(state: dict[str, Any]) -> bool:
    """Whether ``state`` matches the digest saved with it: the whole state's, or in a
    checkpoint written before that existed, the parameters'."""
    try:
        if "state_digest" in state:
            return bool(state["state_digest"] == digest_parts(state))
        return bool(state["digest"] == digest_of(state["model"]))
    except Exception:  # missing parts: not a checkpoint of ours
        return False


def load_latest(directory: Path) -> dict[str, Any] | None:
    pointer = directory / LATEST
    if not pointer.exists():
        return None
    path = directory / pointer.read_text().strip()
    if not path.is_dir():
        return read(path)
    from unicron.train import dcpfiles  # see _read_sharded_checked

    return dcpfiles.read_whole(path)


def digest(module: torch.nn.Module) -> str:
    """A checksum of the parameters alone, to check that runs match: the one a finished task
    reports (``rowdigest.layout_digest``, the same for a whole model and its shards)."""
    return layout_digest(module.state_dict())

"""Checkpoints: model, optimizer, step and data position, written atomically by rank 0."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import torch

from unicron.core.workerenv import host_checkpoint_dir

LATEST = "latest"


def path_for(directory: Path, step: int) -> Path:
    return directory / f"step-{step:08d}.pt"


def state_of(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int, **where: Any
) -> dict[str, Any]:
    """What a checkpoint holds: model, optimizer, step, data position (the stream is addressed
    by step), where it was taken (task, generation, world size) and the parameters' digest."""
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "step": step,
        "data_position": {"step": step},
        **where,
        "digest": digest(model),
    }


def save(directory: Path, step: int, state: dict[str, Any], keep: int = 3) -> Path:
    """Write ``state`` for ``step`` and point ``latest`` at it; keep the newest ``keep``."""
    directory.mkdir(parents=True, exist_ok=True)
    target = path_for(directory, step)
    tmp = target.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, target)
    pointer = directory / (LATEST + ".tmp")
    pointer.write_text(target.name)
    os.replace(pointer, directory / LATEST)
    for old in sorted(directory.glob("step-*.pt"))[:-keep]:
        old.unlink(missing_ok=True)
    return target


def host_dir(persistent: Path, node: str, root: str | None = None) -> Path | None:
    """The node's in-memory checkpoint folder (``core.workerenv.host_checkpoint_dir``); None
    when the host has no RAM-backed folder there."""
    path = host_checkpoint_dir(persistent, node, root)
    return path if path.parents[2].is_dir() else None


def load_nearest(persistent: Path, host: Path | None) -> tuple[dict[str, Any], str] | None:
    """The newest checkpoint from the nearest tier: the node's in-memory copy when it is at
    least as new as the persistent one and its parameters match the digest saved with it, else
    the persistent checkpoint. Returns (state, "host_memory" | "persistent")."""
    saved = load_latest(persistent)
    if host is not None:
        try:
            near = load_latest(host)
        except Exception:  # a torn or foreign file: not a usable copy
            near = None
        if near is not None and (saved is None or near["step"] >= saved["step"]) and _intact(near):
            return near, "host_memory"
    return (saved, "persistent") if saved is not None else None


def _intact(state: dict[str, Any]) -> bool:
    return state.get("digest") is not None and digest_of(state["model"]) == state["digest"]


def load_latest(directory: Path) -> dict[str, Any] | None:
    pointer = directory / LATEST
    if not pointer.exists():
        return None
    state: dict[str, Any] = torch.load(directory / pointer.read_text().strip(), weights_only=False)
    return state


def digest(module: torch.nn.Module) -> str:
    """A checksum of the parameters, to check replicas agree and runs match."""
    return digest_of(module.state_dict())


def digest_of(state_dict: dict[str, Any]) -> str:
    h = hashlib.sha256()
    for name, tensor in sorted(state_dict.items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]

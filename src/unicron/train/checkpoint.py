"""Checkpoints: model, optimizer, step and data position, written atomically by rank 0."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import torch

LATEST = "latest"


def path_for(directory: Path, step: int) -> Path:
    return directory / f"step-{step:08d}.pt"


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


def load_latest(directory: Path) -> dict[str, Any] | None:
    pointer = directory / LATEST
    if not pointer.exists():
        return None
    state: dict[str, Any] = torch.load(directory / pointer.read_text().strip(), weights_only=False)
    return state


def digest(module: torch.nn.Module) -> str:
    """A checksum of the parameters, to check replicas agree and runs match."""
    h = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]

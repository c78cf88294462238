"""The final model written the way its library writes models, for whoever opens it next.

A Hugging Face model (``transformers.PreTrainedModel``) writes itself with ``save_pretrained``
(configuration and safetensors weights) and is opened with ``from_pretrained``; the session's
checkpoints hold the training state instead (optimizer, data position, registered objects).
Only one rank writes, and only the final state: a run that stopped early has no final model.
The folder appears whole or not at all (written beside it, then renamed into place), so a reader
never opens a half-written model.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

from unicron.train import sharded


def export(model: torch.nn.Module, directory: Path, writer: bool) -> Path | None:
    """Write ``model`` to ``directory`` with its ``save_pretrained`` if this rank is the
    ``writer``; returns the folder written (None on the other ranks)."""
    save = getattr(model, "save_pretrained", None)
    if save is None:
        raise TypeError(
            f"{type(model).__name__} has no save_pretrained (a Hugging Face model's): save its"
            " state_dict yourself, or use the session's final checkpoint"
        )
    if sharded.is_sharded(model):
        raise NotImplementedError(
            "save_pretrained of a model sharded with FSDP2 is not supported yet: its final"
            " checkpoint holds the whole state (docs/training-library.md)"
        )
    if not writer:
        return None
    partial = directory.with_name(f".{directory.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    save(partial, safe_serialization=True)
    previous = directory.with_name(f".{directory.name}.previous-{os.getpid()}")
    if directory.exists():
        os.replace(directory, previous)
    os.replace(partial, directory)
    shutil.rmtree(previous, ignore_errors=True)
    return directory

"""The final model written the way its library writes models, for whoever opens it next.

A Hugging Face model (``transformers.PreTrainedModel``) writes itself with ``save_pretrained``
(its configuration and safetensors weights) and is opened with ``from_pretrained``; the session's
checkpoints hold the training state instead (optimizer, data position, registered objects).

The export is asked for before training (``session.steps(..., pretrained=folder)``), so that a bad
folder or a model that cannot be exported fails before any step, and it is written as part of the
end: after the final checkpoint, before the worker reports the task done (the coordinator ends a
task once it is done and stops what still runs of it). Only rank 0 writes, only the final state,
and only while its generation is the task's current one (``fencing.py``: a writer the task went
on without exports nothing). The folder appears whole or not at all: written beside it, then
renamed into place.

A model sharded with FSDP2 inside its replica is exported whole: the ranks of rank 0's replica
gather its parameters (a collective over the replica's group, ``whole``) and rank 0 writes them,
as ``save_pretrained(state_dict=...)`` takes them.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from unicron.train import sharded


def checked(model: torch.nn.Module, directory: str | Path) -> Path:
    """The export's folder, absolute (a relative one is the worker's working directory's), once
    ``model`` and it are known to do: a model with ``save_pretrained`` and a folder name that is
    not a file."""
    if not callable(getattr(model, "save_pretrained", None)):
        raise TypeError(
            f"pretrained=: {type(model).__name__} has no save_pretrained (a Hugging Face model's): save"
            " its state_dict yourself, or read the session's final checkpoint"
        )
    folder = Path(directory).absolute()
    if Path(directory).name in ("", ".", "..") or folder.is_file():  # (not the working folder itself)
        raise ValueError(f"pretrained={directory!s}: name a folder to write the model into (not a file)")
    return folder


def due(rank: int, step: int, iterations: int) -> bool:
    """Whether this worker writes the export as its steps end: rank 0, and only after the task's
    last step (a worker asked to stop before it has no final model to write)."""
    return rank == 0 and step >= iterations


def gathers(rank: int, step: int, iterations: int, replica_size: int) -> bool:
    """Whether this worker takes part in gathering a sharded model for the export: every rank of
    rank 0's replica (ranks 0 to ``replica_size - 1``), after the task's last step."""
    return rank < replica_size and step >= iterations


def whole(model: torch.nn.Module) -> dict[str, Any] | None:
    """A model sharded with FSDP2: its whole parameters, in host memory (every rank of the
    replica calls this: it gathers over the replica's group); an unsharded one: None (it
    writes its own)."""
    if not sharded.is_sharded(model):
        return None
    # (Imported here, as shardedcheckpoint is: DCP's import is a cost every worker start would pay.)
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def export(
    model: torch.nn.Module,
    folder: Path,
    confirm: Callable[[], None],
    gathered: dict[str, Any] | None = None,
) -> None:
    """Write ``model`` into ``folder`` with its ``save_pretrained`` (the ``gathered`` parameters of
    a sharded one), replacing what is there once ``confirm`` (the fence) passes; the writer's
    partial folder is removed if anything fails."""
    partial = folder.with_name(f".{folder.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        given = {} if gathered is None else {"state_dict": gathered}
        model.save_pretrained(partial, **given)  # type: ignore[operator]
        if not (partial / "config.json").is_file():  # (Transformers writes on its group's rank 0 only)
            raise RuntimeError(f"{type(model).__name__}.save_pretrained wrote no config.json into {partial}")
        confirm()
        previous = folder.with_name(f".{folder.name}.previous-{os.getpid()}")
        if folder.exists():
            os.replace(folder, previous)
        os.replace(partial, folder)
        shutil.rmtree(previous, ignore_errors=True)
    finally:
        shutil.rmtree(partial, ignore_errors=True)

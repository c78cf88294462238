"""Reading checkpoints written by ``torch.distributed.checkpoint`` (DCP) without running code.

DCP unpickles its metadata and loads plain values with ``weights_only=False``: anyone who could
write the checkpoint folder could run code in every worker that reads it. Here the metadata is
unpickled allowing only DCP's own metadata classes, and plain values load with ``weights_only``
(as ``checkpoint.read`` loads a whole-state file). ``shardedcheckpoint.py`` writes them.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

from unicron.train.rowdigest import layout_digest

SUFFIX = ".dcp"


class CheckpointCorrupt(ValueError):
    """A checkpoint that cannot be read, or reads back to a state other than the one its digest
    was taken of."""


def path_for(directory: Path, step: int) -> Path:
    return directory / f"step-{step:08d}{SUFFIX}"


def read_whole(path: Path) -> dict[str, Any]:
    """The checkpoint at ``path`` with every tensor whole, in the form a whole-state checkpoint
    (``checkpoint.save``) has: optimizer state keyed by parameter index. Read by one process, no
    group needed. Raises ``CheckpointCorrupt`` when it does not match its digest."""
    state: dict[str, Any] = {}
    try:
        _load_state_dict(state, storage_reader=SafeReader(path), planner=_SafeWholePlanner(), no_dist=True)  # type: ignore[no-untyped-call]
    except CheckpointException as exc:
        raise CheckpointCorrupt(f"{path} could not be read: {exc}") from None
    parts = {k: state[k] for k in ("model", "optimizer", "extras") if k in state}
    if layout_digest(parts) != state.get("layout_digest"):
        raise CheckpointCorrupt(f"{path} does not match its digest")
    return {**state, "optimizer": indexed(state["optimizer"])}


def indexed(optimizer: dict[str, Any]) -> dict[str, Any]:
    """An optimizer state keyed by parameter name (DCP's form) keyed by parameter index, as
    ``Optimizer.state_dict`` keys it: the names, in the order the groups list them."""
    names = [name for group in optimizer["param_groups"] for name in group["params"]]
    index = {name: i for i, name in enumerate(names)}
    groups, start = [], 0
    for group in optimizer["param_groups"]:
        count = len(group["params"])
        groups.append({**group, "params": list(range(start, start + count))})
        start += count
    state = {index[name]: values for name, values in optimizer.get("state", {}).items()}
    return {"state": state, "param_groups": groups}


# ---------------------------------------------------------------------- reading without running code
_METADATA_MODULE = "torch.distributed.checkpoint.metadata"
_ALLOWED = {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.serialization", "_get_layout"),
    ("torch", "Size"),
    ("pathlib", "PosixPath"),
    ("collections", "OrderedDict"),
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        allowed = (module, name) in _ALLOWED or module == _METADATA_MODULE
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            allowed = True
        if not allowed:
            raise pickle.UnpicklingError(f"checkpoint metadata refers to {module}.{name}: not DCP metadata")
        return super().find_class(module, name)


class SafeReader(FileSystemReader):
    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        with open(Path(self.path) / ".metadata", "rb") as stream:
            metadata: Metadata = _MetadataUnpickler(stream).load()
        if not isinstance(metadata, Metadata):
            raise pickle.UnpicklingError("checkpoint metadata is not DCP metadata")
        storage = metadata.storage_meta or StorageMeta()
        storage.load_id = self.load_id
        metadata.storage_meta = storage
        return metadata


def _load_plain(planner: DefaultLoadPlanner, read_item: ReadItem, value: io.BytesIO) -> None:
    # As DefaultLoadPlanner.load_bytes, but a plain value can run no code (weights_only).
    loaded = torch.load(value, weights_only=True)
    if planner.flatten_state_dict:
        set_element(planner.original_state_dict, planner.mappings[read_item.dest_index.fqn], loaded)
    else:
        planner.state_dict[read_item.dest_index.fqn] = loaded


class SafeLoadPlanner(DefaultLoadPlanner):
    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        _load_plain(self, read_item, value)


class _SafeWholePlanner(_EmptyStateDictLoadPlanner):
    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        _load_plain(self, read_item, value)

"""A digest of a training state that does not depend on how it is sharded.

A checkpoint of a sharded replica is written by each rank's shard (``shardedcheckpoint.py``)
and may be read back at another shard count, or whole. ``state.digest_of`` hashes each tensor
whole, which a rank holding a shard cannot do without gathering the tensor. This digest hashes
each row (the first dimension, along which FSDP2 shards) on its own, so a rank hashes only the
rows it holds; the replica gathers the short row hashes (not the tensors), and the digest of the
ordered rows is the same whether the state was whole, sharded in two or in eight.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.distributed.tensor import DTensor, Shard

# One rank's view of a state: (leaf path with its type and shape, whether its rows are split
# over the ranks, the hashes of the rows this rank holds).
Leaves = list[tuple[str, bool, list[bytes]]]
# Every rank's ``Leaves`` (in rank order), given this rank's: a collective over the replica.
Gather = Callable[[Leaves], list[Leaves]]


def layout_digest(state: Any, gather: Gather | None = None) -> str:
    """The digest of ``state`` (nested dicts and lists of tensors, sharded or not, and plain
    values). With sharded tensors in it, ``gather`` collects every rank's row hashes (each rank
    of the replica calls this, with the same state layout)."""
    mine = local_leaves(state)
    every = gather(mine) if gather is not None else [mine]
    h = hashlib.sha256()
    for index, (header, split, rows) in enumerate(mine):
        h.update(header.encode())
        for part in (r[index][2] for r in every) if split else [rows]:
            h.update(b"".join(part))
    return h.hexdigest()[:16]


def local_leaves(state: Any) -> Leaves:
    """The row hashes of the part of ``state`` this rank holds, leaf by leaf in a fixed order."""
    leaves: Leaves = []
    for path, value in _walk(state, ""):
        if isinstance(value, torch.Tensor):
            split = isinstance(value, DTensor) and _split_rows(value)
            local = value.to_local() if isinstance(value, DTensor) else value
            header = f"{path}|{value.dtype}|{tuple(value.shape)}"
            leaves.append((header, split, _row_hashes(local)))
        else:
            leaves.append((f"{path}={value!r}", False, []))
    return leaves


def _split_rows(value: DTensor) -> bool:
    """Whether the tensor's rows are split over the mesh's ranks, in rank order (FSDP2's
    ``Shard(0)`` on a one-dimensional mesh); otherwise every rank holds it whole."""
    placements = value.placements
    if value.device_mesh.ndim != 1 or len(placements) != 1:
        raise ValueError(f"a tensor placed {placements} on a {value.device_mesh.ndim}-D mesh: only FSDP2's")
    return isinstance(placements[0], Shard) and placements[0].dim == 0


def _row_hashes(tensor: torch.Tensor) -> list[bytes]:
    flat = tensor.detach().cpu().contiguous()
    if flat.dim() == 0:
        flat = flat.reshape(1)
    if flat.shape[0] == 0:
        return []
    rows = flat.reshape(flat.shape[0], -1).view(torch.uint8).numpy()
    return [hashlib.blake2b(row.tobytes(), digest_size=8).digest() for row in rows]


_CONTAINERS = (dict, list, tuple, torch.Tensor)


def _walk(value: Any, path: str) -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for key in sorted(value, key=str):
            yield from _walk(value[key], f"{path}/{key}")
    elif isinstance(value, (list, tuple)) and any(isinstance(v, _CONTAINERS) for v in value):
        for index, item in enumerate(value):
            yield from _walk(item, f"{path}[{index}]")
    else:
        yield path, value

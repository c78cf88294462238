"""The tinygpt example with its model sharded by FSDP2 inside each data-parallel replica: HSDP
under Unicron. Run it as a task with ``run.replica_size: 2`` (examples/fsdp/task.yaml): each
replica's two ranks hold half of every block's parameters and optimizer state; Unicron sums the
shards' gradients over the replicas, recovers a replica that fails as a whole, and gives its
replacement each shard from the matching rank of a live replica.

Its defaults make a GPT of about 20M parameters; alone (a world of one) it trains unsharded.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch.distributed.fsdp import fully_shard

import unicron.train as ut

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tinygpt"))
from train import parse, train


def shard(model: torch.nn.Module, session: ut.Session) -> None:
    """FSDP2 over the replica's ranks: each block a unit, then the rest (embeddings, norm)."""
    mesh = session.mesh  # None when the task's replicas are of one rank: nothing to shard
    if mesh is None:
        return
    for block in model.blocks:  # type: ignore[union-attr]
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)


if __name__ == "__main__":
    train(parse(__doc__, layers=8, hidden=448, heads=8, sequence=64, vocab=256), shard)

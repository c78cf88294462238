"""The Llama (llama.py) sharded with FSDP2 inside each data-parallel replica: HSDP under Unicron,
as examples/fsdp does for the tiny GPT. Run it as a task with ``run.replica_size: 2``: each
replica's two ranks hold half of every decoder layer's parameters and optimizer state; Unicron
sums the shards' gradients over the replicas, recovers a lost replica in place, and exports the
final model whole (``--export``). Its defaults are the DDP port's batch and corpus: it trains on
train_ddp.py's samples (alone, a world of one, it trains unsharded).
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import torch
from llama import SEQUENCE, VOCAB, llama, lm_loss, options
from torch.distributed.fsdp import fully_shard

import unicron.train as ut

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tinygpt"))
from train import parse, train


def shard(model: torch.nn.Module, session: ut.Session) -> None:
    """FSDP2 over the replica's ranks: each decoder layer a unit, then the rest (the embedding,
    the final norm, the head)."""
    mesh = session.mesh  # None when the task's replicas are of one rank: nothing to shard
    if mesh is None:
        return
    for layer in model.model.layers:  # type: ignore[union-attr]
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)


if __name__ == "__main__":
    ours = options()
    args = parse(__doc__, dataset_size=512, global_batch=16, micro_batch=2)
    if (args.vocab, args.sequence) != (VOCAB, SEQUENCE):  # (the corpus follows them, the Llama not)
        raise SystemExit(f"--vocab and --sequence: this Llama takes {VOCAB} and {SEQUENCE} (llama.py)")
    train(args, shard, functools.partial(llama, pretrained=ours.pretrained), lm_loss, ours.export)

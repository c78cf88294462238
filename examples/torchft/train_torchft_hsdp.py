"""examples/fsdp/train_hsdp.py written the way torchft runs HSDP (torchtitan's torchft
integration): each replica group is a torchrun job whose ranks shard the model with FSDP2 over
their own group; across groups, FSDP's all-reduce hook averages each rank's gradient shard
through torchft's Manager (a ``ManagedProcessGroup``: the quorum's live groups, a failed sum
reported to the manager, the step then not committed). The same model, data, optimizer,
schedule, accumulation and clipping as the HSDP script; a group that joins heals its shards from
the matching rank of a live group.

    torchft_lighthouse --min_replicas 1 --bind [::]:29510 &
    for i in 0 1; do
      REPLICA_GROUP_ID=$i NUM_REPLICA_GROUPS=2 TORCHFT_LIGHTHOUSE=http://localhost:29510 \\
        torchrun --standalone --nproc-per-node 2 examples/torchft/train_torchft_hsdp.py &
    done

Replica groups of two ranks for the benchmarks' sharded rows (bench/overhead_bench.py).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.utils.data import DataLoader
from torchft import DistributedSampler, Manager, Optimizer, ProcessGroupGloo
from torchft.process_group import ManagedProcessGroup

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tinygpt"))
from corpus import make_corpus
from model import Config, TinyGPT, lm_loss
from schedule import warmup_cosine


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--iterations", type=int, default=40)
    p.add_argument("--global-batch", type=int, default=16)
    p.add_argument("--micro-batch", type=int, default=2)
    p.add_argument("--dataset-size", type=int, default=512)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=448)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--sequence", type=int, default=64)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--checkpoint", default="torchft-hsdp-checkpoint.pt")
    p.add_argument("--step-delay", type=float, default=0.0, help="extra seconds per step (benchmarks)")
    return p.parse_args()


def average_across_groups(model: torch.nn.Module, manager: Manager) -> None:
    """After FSDP's reduce-scatter inside the group, each rank's gradient shard is averaged over
    the quorum's groups through torchft's manager (torchtitan's torchft integration does this)."""
    across_groups = ManagedProcessGroup(manager).register("dp_replicate")

    def all_reduce_hook(shard: torch.Tensor) -> None:
        dist.all_reduce(shard, group=across_groups, op=dist.ReduceOp.AVG)

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_all_reduce_hook(all_reduce_hook)


def micro_batches(args: argparse.Namespace, group: int, groups: int) -> Any:
    """This rank's micro-batches, epoch after epoch (reshuffled each). Its global rank, rank +
    size * group, is the HSDP script's rank on its (replicate, shard) mesh."""
    corpus = make_corpus(args.dataset_size, args.sequence, args.vocab, args.seed)
    sampler = DistributedSampler(
        corpus,
        replica_rank=group,
        num_replica_groups=groups,
        group_rank=dist.get_rank(),
        num_replicas=dist.get_world_size(),
        seed=args.seed,
    )
    loader = DataLoader(corpus, batch_size=args.micro_batch, sampler=sampler, drop_last=True)
    for epoch in range(sys.maxsize):
        sampler.set_epoch(epoch)
        yield from loader


def main() -> None:
    args = parse()
    torch.set_num_threads(1)
    group, groups = int(os.environ.get("REPLICA_GROUP_ID", 0)), int(os.environ.get("NUM_REPLICA_GROUPS", 1))
    dist.init_process_group("gloo")  # the replica group's own ranks (its torchrun job)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("shard",))
    torch.manual_seed(args.seed)
    model = TinyGPT(Config(args.vocab, args.sequence, args.layers, args.hidden, args.heads))
    model = model.to(getattr(torch, args.dtype))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    inner = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(inner, warmup_cosine(args.warmup, args.iterations))

    def state_dict() -> dict[str, Any]:  # this rank's shards, sent to the same rank of a healing group
        shards, optim = get_state_dict(model, inner)
        return {"model": shards, "optim": optim, "scheduler": scheduler.state_dict()}

    def load_state_dict(state: dict[str, Any]) -> None:
        set_state_dict(model, inner, model_state_dict=state["model"], optim_state_dict=state["optim"])
        scheduler.load_state_dict(state["scheduler"])

    manager = Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=5)),  # as torchft's train_ddp.py on CPU
        min_replica_size=1,
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        replica_id=f"train_torchft_hsdp_{group}",
        timeout=timedelta(seconds=30),
        init_sync=False,  # every group seeds the same parameters (see train_torchft.py)
    )
    average_across_groups(model, manager)
    optimizer = Optimizer(manager, inner)
    batches = micro_batches(args, group, groups)
    accumulation = args.global_batch // (groups * dist.get_world_size() * args.micro_batch)
    while manager.current_step() < args.iterations:
        step = manager.current_step()
        optimizer.zero_grad()  # starts the step's quorum
        for i in range(accumulation):
            model.set_requires_gradient_sync(i == accumulation - 1)  # type: ignore[operator]
            (lm_loss(model, next(batches)) / accumulation).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        optimizer.step()  # only if every group in the quorum reduced its gradients
        if manager.current_step() > step:
            scheduler.step()
        time.sleep(args.step_delay)
    whole = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if group == 0 and dist.get_rank() == 0:
        torch.save({"model": whole, "step": manager.current_step()}, args.checkpoint)
    manager.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""The same GPT trained the usual way under torchrun with FSDP2 HSDP: a 2-D device mesh
(replicate x shard), ``fully_shard`` on it (reduce-scatter inside a replica, all-reduce across
replicas), DistributedSampler + DataLoader, gradient accumulation, clipping. The baseline that
examples/fsdp/train.py is compared with; nothing here recovers from a failure.

    torchrun --standalone --nproc-per-node 4 examples/fsdp/train_hsdp.py --replica-size 2
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, DistributedSampler

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tinygpt"))
from corpus import make_corpus
from model import Config, TinyGPT, lm_loss
from schedule import warmup_cosine


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--replica-size", type=int, default=2, help="ranks per replica (the shard dimension)")
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
    p.add_argument("--checkpoint", default=None, help="save the final parameters (whole) here")
    return p.parse_args()


def main() -> None:
    args = parse()
    torch.set_num_threads(1)
    gpu = torch.cuda.is_available()  # a GPU per rank (torchrun: the one at its local rank), NCCL
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if gpu else torch.device("cpu")
    dist.init_process_group("nccl" if gpu else "gloo", device_id=device if gpu else None)
    world = dist.get_world_size()
    mesh = init_device_mesh(
        device.type, (world // args.replica_size, args.replica_size), mesh_dim_names=("replicate", "shard")
    )
    torch.manual_seed(args.seed)
    config = Config(args.vocab, args.sequence, args.layers, args.hidden, args.heads)
    model = TinyGPT(config).to(device, getattr(torch, args.dtype))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(args.warmup, args.iterations))
    corpus = make_corpus(args.dataset_size, args.sequence, args.vocab, args.seed)
    sampler = DistributedSampler(corpus, shuffle=True, seed=args.seed, drop_last=True)
    loader = DataLoader(corpus, batch_size=args.micro_batch, sampler=sampler, drop_last=True)
    accumulation = args.global_batch // (world * args.micro_batch)
    started = time.perf_counter()
    for step in range(args.iterations):
        if step % (len(loader) // accumulation) == 0:  # a new epoch
            sampler.set_epoch(step // (len(loader) // accumulation))
            batches = iter(loader)
        for i in range(accumulation):
            model.set_requires_gradient_sync(i == accumulation - 1)  # FSDP2's no_sync
            (lm_loss(model, next(batches).to(device)) / accumulation).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    if dist.get_rank() == 0:
        print(f"{args.iterations} steps in {time.perf_counter() - started:.2f} s")
    if args.checkpoint:
        whole = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if dist.get_rank() == 0:
            torch.save({"model": whole, "step": args.iterations}, args.checkpoint)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""A plain DDP training script, as people bring it: torchrun, DistributedSampler + DataLoader,
AdamW with weight decay, a warm-up + cosine schedule, gradient accumulation, clipping, its own
checkpoint. `train_unicron.py` is its port (the diff is in docs/training-library.md).

    torchrun --standalone --nproc-per-node 2 examples/ddp-port/train_ddp.py --iterations 20
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tinygpt"))
from corpus import make_corpus
from model import Config, TinyGPT, lm_loss
from schedule import warmup_cosine

Model = Callable[[argparse.Namespace], torch.nn.Module]  # the model of the arguments
Loss = Callable[[torch.nn.Module, torch.Tensor], torch.Tensor]  # a micro-batch's mean loss


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
    p.add_argument("--bf16", action="store_true", help="forward under torch.autocast to bfloat16")
    p.add_argument("--layers", type=int, default=Config.layers)
    p.add_argument("--hidden", type=int, default=Config.hidden)
    p.add_argument("--heads", type=int, default=Config.heads)
    p.add_argument("--checkpoint", default="ddp-checkpoint.pt")
    return p.parse_args()


def tiny_gpt(args: argparse.Namespace) -> torch.nn.Module:
    return TinyGPT(Config(layers=args.layers, hidden=args.hidden, heads=args.heads))


def forward(net: torch.nn.Module, batch: torch.Tensor, bf16: bool, loss: Loss) -> torch.Tensor:
    """The micro-batch's mean loss, in mixed precision when asked (bf16, on the CPU or a GPU)."""
    with torch.autocast(batch.device.type, torch.bfloat16, enabled=bf16):
        return loss(net, batch)


def main(build: Model = tiny_gpt, loss: Loss = lm_loss, export: str | None = None) -> None:
    """Train ``build``'s model (another: examples/hf-llama/ passes a Hugging Face Llama, and
    ``export``: where its final model is written with save_pretrained)."""
    args = parse()
    torch.set_num_threads(1)
    gpu = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if gpu else torch.device("cpu")
    dist.init_process_group("nccl" if gpu else "gloo", device_id=device if gpu else None)
    torch.manual_seed(args.seed)
    model = build(args).to(device, getattr(torch, args.dtype))
    net = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(args.warmup, args.iterations))
    corpus = make_corpus(args.dataset_size, 32, 64, args.seed)
    sampler = DistributedSampler(corpus, shuffle=True, seed=args.seed, drop_last=True)
    loader = DataLoader(corpus, batch_size=args.micro_batch, sampler=sampler, drop_last=True)
    accumulation = args.global_batch // (dist.get_world_size() * args.micro_batch)
    for step in range(args.iterations):
        if step % (len(loader) // accumulation) == 0:  # a new epoch
            sampler.set_epoch(step // (len(loader) // accumulation))
            batches = iter(loader)
        for i in range(accumulation):
            with net.no_sync() if i < accumulation - 1 else nullcontext():
                (forward(net, next(batches).to(device), args.bf16, loss) / accumulation).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    if dist.get_rank() == 0:
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step + 1}
        torch.save({**state, "scheduler": scheduler.state_dict()}, args.checkpoint)
        if export:
            model.save_pretrained(export)
    del net  # DDP's reducer holds the group: freed after it, exit can hang (docs/pytorch-notes.md)
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

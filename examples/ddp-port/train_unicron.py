"""train_ddp.py ported to Unicron: the same model, data order, optimizer, schedule, accumulation
and clipping; the session recovers in place (the diff is in docs/training-library.md).

    torchrun --standalone --nproc-per-node 2 examples/ddp-port/train_unicron.py --iterations 20
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

import torch

import unicron.train as ut

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
    p.add_argument("--checkpoint", default="unicron-checkpoints")
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
    session = ut.init(iterations=args.iterations, checkpoint_dir=args.checkpoint, checkpoint_every=10)
    device = session.device
    torch.manual_seed(args.seed)
    model = build(args).to(device, getattr(torch, args.dtype))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(args.warmup, session.iterations))
    session.register("scheduler", scheduler)
    corpus = make_corpus(args.dataset_size, 32, 64, args.seed)
    loader = session.loader(corpus, args.global_batch, batch_size=args.micro_batch, seed=args.seed)
    for _ in session.steps(model, optimizer, pretrained=export):
        for batch in loader:
            forward(model, batch.to(device), args.bf16, loss).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        optimizer.step()
        optimizer.zero_grad()
    session.close()


if __name__ == "__main__":
    main()

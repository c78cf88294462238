"""train_ddp.py ported to Unicron (the diff is in docs/training-library.md): the same model,
data, optimizer, schedule, accumulation and clipping; the session deals the samples in
DistributedSampler's order, keeps the scheduler and checkpoints, and recovers in place.

    torchrun --standalone --nproc-per-node 2 examples/ddp-port/train_unicron.py --iterations 20
    (or as a Unicron task: run.program: [python, examples/ddp-port/train_unicron.py])
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import unicron.train as ut

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
    p.add_argument("--layers", type=int, default=Config.layers)
    p.add_argument("--hidden", type=int, default=Config.hidden)
    p.add_argument("--heads", type=int, default=Config.heads)
    p.add_argument("--checkpoint", default="unicron-checkpoints")
    return p.parse_args()


def main() -> None:
    args = parse()
    torch.set_num_threads(1)
    session = ut.init(iterations=args.iterations, checkpoint_dir=args.checkpoint, checkpoint_every=10).start()
    torch.manual_seed(args.seed)
    config = Config(layers=args.layers, hidden=args.hidden, heads=args.heads)
    model = TinyGPT(config).to(getattr(torch, args.dtype))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine(args.warmup, session.iterations))
    corpus = make_corpus(args.dataset_size, 32, 64, args.seed)
    session.register("scheduler", scheduler)
    session.resume(model, optimizer)
    session.configure_data(args.global_batch, args.micro_batch, corpus, seed=args.seed)
    for step in session.steps():
        session.train_step(step, model, optimizer, lambda b: lm_loss(model, b), max_grad_norm=args.clip)
        session.maybe_checkpoint(model, optimizer)
    session.finish(model, optimizer)
    session.close()


if __name__ == "__main__":
    main()

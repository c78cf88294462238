"""examples/ddp-port/train_ddp.py written the way torchft's own examples are (its train_ddp.py):
the same model, data, optimizer, schedule, accumulation and clipping, with torchft's Manager,
its DistributedDataParallel and optimizer wrapper, and its DistributedSampler over replica
groups. Each replica group (here of one rank) is its own torchrun job; a lighthouse forms a
quorum of the live groups every step, and a group that joins heals from a live one.

    torchft_lighthouse --min_replicas 1 --bind [::]:29510 &
    for i in 0 1; do
      REPLICA_GROUP_ID=$i NUM_REPLICA_GROUPS=2 TORCHFT_LIGHTHOUSE=http://localhost:29510 \\
        torchrun --standalone --nproc-per-node 1 examples/torchft/train_torchft.py --iterations 20 &
    done

The peer Unicron is measured against (bench/overhead_bench.py, docs/performance.md). A step that
a group fails (a peer lost in the all-reduce) is not committed: its samples are dropped, as
torchft does. torchft 2026.10.26 (`make venv` installs it).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from contextlib import nullcontext
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader
from torchft import DistributedDataParallel, DistributedSampler, Manager, Optimizer, ProcessGroupGloo

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
    p.add_argument("--checkpoint", default="torchft-checkpoint.pt")
    p.add_argument(
        "--step-delay", type=float, default=0.0, help="extra seconds per step (the recovery bench)"
    )
    return p.parse_args()


def micro_batches(args: argparse.Namespace, group: int, groups: int) -> Any:
    """The group's micro-batches, epoch after epoch (reshuffled each). As in torchft's own
    example, the data position is the group's own and is not restored when a group heals (a
    healed group starts its stream again); a step that is not committed has consumed its
    micro-batches all the same."""
    corpus = make_corpus(args.dataset_size, 32, 64, args.seed)
    sampler = DistributedSampler(
        corpus, replica_rank=group, num_replica_groups=groups, group_rank=0, num_replicas=1, seed=args.seed
    )
    loader = DataLoader(corpus, batch_size=args.micro_batch, sampler=sampler, drop_last=True)
    for epoch in range(sys.maxsize):
        sampler.set_epoch(epoch)
        yield from loader


def main() -> None:
    args = parse()
    torch.set_num_threads(1)
    group, groups = int(os.environ.get("REPLICA_GROUP_ID", 0)), int(os.environ.get("NUM_REPLICA_GROUPS", 1))
    torch.manual_seed(args.seed)
    config = Config(layers=args.layers, hidden=args.hidden, heads=args.heads)
    model = TinyGPT(config).to(getattr(torch, args.dtype))
    inner = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(inner, warmup_cosine(args.warmup, args.iterations))

    def state_dict() -> dict[str, Any]:  # what a healing group receives from a live one
        return {"model": model.state_dict(), "optim": inner.state_dict(), "scheduler": scheduler.state_dict()}

    def load_state_dict(state: dict[str, Any]) -> None:
        model.load_state_dict(state["model"])
        inner.load_state_dict(state["optim"])
        scheduler.load_state_dict(state["scheduler"])

    manager = Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=5)),  # as torchft's train_ddp.py on CPU
        min_replica_size=1,
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        replica_id=f"train_torchft_{group}",
        timeout=timedelta(seconds=30),
        # Every group seeds the same initial parameters, so step 0 needs no healing (with it, all
        # but one group would sit out the first step's gradients while they copy the state).
        init_sync=False,
    )
    net = DistributedDataParallel(manager, model)
    optimizer = Optimizer(manager, inner)
    batches = micro_batches(args, group, groups)
    accumulation = args.global_batch // (groups * args.micro_batch)
    while manager.current_step() < args.iterations:
        step = manager.current_step()
        optimizer.zero_grad()  # starts the step's quorum
        for i in range(accumulation):
            with net.no_sync() if i < accumulation - 1 else nullcontext():
                (lm_loss(net, next(batches)) / accumulation).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        optimizer.step()  # only if every group in the quorum reduced its gradients
        if manager.current_step() > step:
            scheduler.step()
        time.sleep(args.step_delay)
    if group == 0:
        torch.save({**state_dict(), "step": manager.current_step()}, args.checkpoint)
    manager.shutdown()


if __name__ == "__main__":
    main()

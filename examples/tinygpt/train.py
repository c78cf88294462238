"""Train a small GPT with data parallelism under Unicron (also runs alone: a world of one).

    python examples/tinygpt/train.py --iterations 50 --checkpoint-dir /tmp/ckpt

Under a Unicron agent the iterations, checkpoint directory and peers come from the environment.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from corpus import make_corpus
from model import Config, TinyGPT, lm_loss
from schedule import warmup_cosine

import unicron.train as ut


def parse(doc: str | None = __doc__, **defaults: object) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=doc)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--sequence", type=int, default=32)
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--dataset-size", type=int, default=4096, help="sequences in the corpus")
    p.add_argument("--global-batch", type=int, default=32, help="sequences per optimizer step")
    p.add_argument("--micro-batch", type=int, default=4, help="sequences per forward/backward")
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
    p.add_argument("--warmup", type=int, default=10, help="steps of linear warm-up, then cosine decay")
    p.add_argument("--clip", type=float, default=1.0, help="clip gradients to this global norm (0: off)")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    p.add_argument(
        "--fp16", action="store_true", help="forward under float16 autocast, the loss scaled by a GradScaler"
    )
    p.add_argument("--iterations", type=int, default=100, help="steps, when not run by an agent")
    p.add_argument("--checkpoint-dir", default=None, help="when not run by an agent")
    p.add_argument("--checkpoint-every", type=int, default=20)
    p.add_argument("--step-delay", type=float, default=0.0, help="extra seconds per step (to slow a demo)")
    p.add_argument(
        "--step-delay-file",
        type=Path,
        default=None,
        help="a file holding the extra seconds per step, read at every step (where it is missing: "
        "--step-delay): a test that has seen what it waited for lets the run go at full speed",
    )
    p.add_argument(
        "--device-seconds-per-sample",
        type=float,
        default=0.0,
        help="emulated accelerator time per sample: each worker then computes like a device of that "
        "speed, whatever the host's cores (the demo's slots stand for GPUs)",
    )
    p.set_defaults(**defaults)
    return p.parse_args()


def main() -> None:
    train(parse())


def tiny_gpt(args: argparse.Namespace) -> torch.nn.Module:
    """The example's own model, of the arguments' size."""
    return TinyGPT(Config(args.vocab, args.sequence, args.layers, args.hidden, args.heads))


def train(
    args: argparse.Namespace,
    shard: Callable[[torch.nn.Module, ut.Session], None] | None = None,
    build: Callable[[argparse.Namespace], torch.nn.Module] = tiny_gpt,
    loss_of: Callable[[torch.nn.Module, torch.Tensor], torch.Tensor] = lm_loss,
    export: str | None = None,
) -> None:
    """The training run; ``shard``: how to shard the model inside its replica (examples/fsdp).
    Another model (examples/hf-llama: a Hugging Face Llama): ``build``, its micro-batch's mean
    loss ``loss_of``, and ``export``, where its final model is written with save_pretrained."""
    torch.set_num_threads(1)
    dtype = getattr(torch, args.dtype)
    corpus = make_corpus(args.dataset_size, args.sequence, args.vocab, args.seed)
    with ut.init(
        iterations=args.iterations, checkpoint_dir=args.checkpoint_dir, checkpoint_every=args.checkpoint_every
    ) as session:
        torch.manual_seed(args.seed)  # the same initial parameters on every rank
        model = build(args).to(session.device, dtype)  # its GPU, if the worker was given one
        if shard is not None:
            shard(model, session)
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, warmup_cosine(args.warmup, session.iterations)
        )
        session.register("scheduler", scheduler)  # checkpointed, transferred and stepped with the model
        scaler = torch.amp.GradScaler(session.device.type, enabled=args.fp16)
        if args.fp16:
            session.register("scaler", scaler)  # its scale, kept and transferred with the rest
        # The corpus (a tensor of sequences) is the dataset; the session deals its samples to the
        # ranks as DistributedSampler would, seeded per epoch, in micro-batches of micro_batch.
        loader = session.loader(corpus, args.global_batch, batch_size=args.micro_batch, seed=args.seed)
        # The step's loss, averaged over its global batch, and checked with the gradient sum before
        # the step is applied: not finite, or a spike, and the numerical rung runs. (Metrics are
        # not yet reduced within replicas of several ranks.)
        losses = session.metric("loss", checked=True) if session.replica_size == 1 else None
        for _ in session.steps(model, optimizer, pretrained=export):
            # The loader yields this rank's micro-batches and ends once the gradients are reduced;
            # after a peer fails it yields the micro-batches the survivors take over.
            for batch in loader:
                with torch.autocast(session.device.type, torch.float16, enabled=args.fp16):
                    loss = loss_of(model, batch.to(session.device))
                scaler.scale(loss).backward()
                if losses is not None:
                    losses.add(loss)
                if args.device_seconds_per_sample:
                    time.sleep(args.device_seconds_per_sample * len(batch))
            if args.clip:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            scaler.step(optimizer)  # optimizer.step(), unless the gradients overflowed
            scaler.update()
            optimizer.zero_grad()
            if delay := step_delay(args):
                time.sleep(delay)
        if session.rank == 0:
            done = "finished" if session.step >= session.iterations else "stopped at"
            print(f"{done} step {session.step}, parameters {session.digest}")


def step_delay(args: argparse.Namespace) -> float:
    """This step's pause: the file's number where it holds one, else ``--step-delay``."""
    if args.step_delay_file is not None:
        try:
            return max(0.0, float(args.step_delay_file.read_text()))
        except (OSError, ValueError):  # not written yet, or being written
            pass
    return float(args.step_delay)


if __name__ == "__main__":
    main()

"""The training session: what a worker wraps around an ordinary data-parallel training loop.

It sets torch.distributed up from the agent's environment (the task's rendezvous store, with a
prefix per generation), tells the worker which samples each step trains on, reports every
iteration, forwards exceptions before the process dies, and saves and restores checkpoints
(model, optimizer, step, data position). Run without an agent, it is a world of one.
See docs/training-library.md for the diff against a plain DDP script.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
import torch.distributed as dist

from unicron.core.classify import classify_exception
from unicron.core.protocol import CheckpointReport, DoneReport, ExceptionReport, FaultReport, IterationReport
from unicron.train import checkpoint
from unicron.train.channel import ReportChannel
from unicron.train.data import DataStream, MicroBatch, global_batch_ids, micro_batches, shard
from unicron.train.faults import FaultInjector


@dataclass
class Iteration:
    """One step being timed; the loop records each micro-batch's loss and samples."""

    step: int
    micro_batches: int = 0  # how many the plan gave this rank (0: unknown)
    before_last: Callable[[], None] | None = None
    started: float = field(default_factory=time.perf_counter)
    loss: float = 0.0
    samples: int = 0
    marks: list[float] = field(default_factory=list)

    def record(self, mean_loss: float, samples: int) -> None:
        """Add a micro-batch: its mean loss and how many samples it held."""
        self.loss += mean_loss * samples
        self.samples += samples
        self.marks.append(time.perf_counter())
        if self.before_last is not None and len(self.marks) == self.micro_batches - 1:
            self.before_last()

    def compute_s(self, ended: float) -> float:
        """The rank's own compute time. Only the last micro-batch's backward waits for peers (the
        gradient all-reduce), so the others' mean time stands in for it; with one micro-batch
        the whole step is all we know."""
        if len(self.marks) < 2:
            return ended - self.started
        own = self.marks[-2] - self.started
        return own * len(self.marks) / (len(self.marks) - 1)


class Session:
    def __init__(
        self,
        env: Mapping[str, str] | None = None,
        *,
        iterations: int | None = None,
        checkpoint_dir: str | Path | None = None,
        checkpoint_every: int | None = None,
        timeout_s: float = 1800.0,
    ) -> None:
        env = os.environ if env is None else env
        # Under a Unicron agent the UNICRON_* variables say everything; under torchrun (the
        # baseline we compare with) its RANK/WORLD_SIZE/MASTER_ADDR and restart count do.
        self.under_torchrun = "UNICRON_TASK" not in env and "TORCHELASTIC_RUN_ID" in env
        restarts = int(env.get("TORCHELASTIC_RESTART_COUNT", "0"))
        self.task = env.get("UNICRON_TASK", "torchrun" if self.under_torchrun else "standalone")
        self.generation = int(env.get("UNICRON_GENERATION", restarts + 1 if self.under_torchrun else 0))
        self.rank = int(env.get("UNICRON_RANK", env.get("RANK", "0")))
        self.world_size = int(env.get("UNICRON_WORLD_SIZE", env.get("WORLD_SIZE", "1")))
        self.local_rank = int(env.get("UNICRON_LOCAL_RANK", env.get("LOCAL_RANK", "0")))
        self.trace_file = env.get("UNICRON_TRACE_FILE")
        self.store_address = env.get("UNICRON_STORE")
        self.iterations = int(env.get("UNICRON_ITERATIONS", iterations or 0))
        self.checkpoint_every = int(env.get("UNICRON_CHECKPOINT_EVERY", checkpoint_every or 0))
        directory = env.get("UNICRON_CHECKPOINT_DIR", str(checkpoint_dir) if checkpoint_dir else "")
        self.checkpoint_dir = Path(directory) if directory else None
        self.timeout = timedelta(seconds=float(env.get("UNICRON_PG_TIMEOUT", timeout_s)))
        self.channel = ReportChannel(env.get("UNICRON_AGENT_SOCKET"))
        self.faults = FaultInjector.from_env(env, self.rank, self.generation, self.task, self._fault_report)
        self._micro_batches = 0
        self.data: DataStream | None = None
        self.step = 0
        self.stop_requested = False
        self._started = False

    # ------------------------------------------------------------------ set-up
    def start(self) -> Session:
        """Join the task's process group (nothing to join in a world of one)."""
        if self._started:
            return self
        self._started = True
        if threading.current_thread() is threading.main_thread():
            # The agent stops workers with SIGTERM: finish the step, checkpoint, exit cleanly.
            signal.signal(signal.SIGTERM, self._on_stop)
        self.trace("started")
        if self.world_size > 1 and self.under_torchrun:
            dist.init_process_group("gloo", timeout=self.timeout)  # env:// from torchrun
        elif self.world_size > 1:
            if not self.store_address:
                raise RuntimeError("UNICRON_STORE is not set: run workers through a Unicron agent")
            host, port = self.store_address.rsplit(":", 1)
            base = dist.TCPStore(host, int(port), is_master=False, timeout=self.timeout)  # type: ignore[attr-defined]
            store = dist.PrefixStore(f"{self.task}/g{self.generation}", base)  # type: ignore[attr-defined]
            backend = (
                "nccl" if torch.cuda.is_available() and os.environ.get("CUDA_VISIBLE_DEVICES") else "gloo"
            )
            dist.init_process_group(
                backend, store=store, rank=self.rank, world_size=self.world_size, timeout=self.timeout
            )
        return self

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """The model as the training loop should call it: DDP when there are peers."""
        if self.world_size > 1:
            from torch.nn.parallel import DistributedDataParallel

            return DistributedDataParallel(model)
        return model

    # ------------------------------------------------------------------ the loop
    def resume(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
        """Load the latest checkpoint, if any; return the step it holds (0 without one)."""
        state = checkpoint.load_latest(self.checkpoint_dir) if self.checkpoint_dir else None
        if state is not None:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            self.step = int(state["step"])
        return self.step

    def _on_stop(self, signum: int, frame: Any) -> None:
        self.trace("sigterm")
        self.stop_requested = True

    def trace(self, what: str, **detail: Any) -> None:
        """Append a timestamped line to UNICRON_TRACE_FILE, if set (for measurements)."""
        if self.trace_file:
            line = {
                "time": time.time(),
                "what": what,
                "rank": self.rank,
                "generation": self.generation,
                **detail,
            }
            with open(self.trace_file, "a") as out:
                out.write(json.dumps(line) + "\n")

    def steps(self) -> Iterator[int]:
        """The steps still to train, 1-based, after the resumed one; ends early when the
        worker is asked to stop, so that ``finish`` checkpoints at a step boundary."""
        while self.step < self.iterations and not self.stop_requested:
            yield self.step + 1

    def plan(
        self, step: int, global_batch: int, micro_batch: int, dataset_size: int, seed: int = 0
    ) -> list[MicroBatch]:
        """This rank's micro-batches for ``step``: its share of the step's global batch."""
        ids = global_batch_ids(step, global_batch, dataset_size, seed)
        share = shard(ids, self.rank, self.world_size)
        planned = micro_batches(share, micro_batch, global_batch, self.world_size)
        self._micro_batches = len(planned)
        return planned

    def configure_data(self, global_batch: int, micro_batch: int, dataset_size: int, seed: int = 0) -> None:
        """Declare the data stream once, so that ``train_step`` can plan (and re-plan) micro-batches."""
        self.data = DataStream(global_batch, micro_batch, dataset_size, seed)

    def train_step(
        self,
        step: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        loss_of: Callable[[list[int]], torch.Tensor],
    ) -> float:
        """One optimizer step run by the library: this rank's micro-batches (``loss_of(ids)``
        returns the mean loss of those samples), the gradient all-reduce, the update. Returns the
        mean loss of this rank's samples. Owning the loop lets the library recover a failed step
        in-process with exactly the same global batch."""
        if self.data is None:
            raise RuntimeError("call configure_data(...) before train_step(...)")
        with self.iteration(step) as it:
            share = shard(global_batch_ids(step, *self.data.stream()), self.rank, self.world_size)
            self._micro_batches = -(-len(share) // self.data.micro_batch)
            self._accumulate(share, loss_of, it)
            self._reduce(model)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return it.loss / it.samples if it.samples else 0.0

    def _accumulate(
        self, ids: list[int], loss_of: Callable[[list[int]], torch.Tensor], it: Iteration
    ) -> None:
        # Each sample's gradient counts 1/B: the SUM over ranks is then the global mean for any
        # number of ranks, and work can move between ranks without rescaling.
        assert self.data is not None
        for start in range(0, len(ids), self.data.micro_batch):
            chunk = ids[start : start + self.data.micro_batch]
            loss = loss_of(chunk)
            (loss * (len(chunk) / self.data.global_batch)).backward()  # type: ignore[no-untyped-call]
            it.record(loss.item(), len(chunk))

    def _reduce(self, model: torch.nn.Module) -> None:
        """Sum the gradients over the ranks, as one flat buffer."""
        if self.world_size == 1:
            return
        params = [p for p in model.parameters() if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in params if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()

    @contextlib.contextmanager
    def iteration(self, step: int) -> Iterator[Iteration]:
        """Time and report one optimizer step; the step counts once the block completes."""
        it = Iteration(step, self._micro_batches, lambda: self.faults.before_last_micro_batch(step))
        self.faults.step_started(step)  # inside the step's time: a slowed rank computes slowly
        yield it
        ended = time.perf_counter()
        self.step = step
        self.channel.send(
            IterationReport(
                task=self.task,
                generation=self.generation,
                rank=self.rank,
                step=step,
                duration_s=ended - it.started,
                samples=it.samples,
                loss=it.loss / it.samples if it.samples else 0.0,
                time=time.time(),
                compute_s=it.compute_s(ended),
            )
        )

    def maybe_checkpoint(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, force: bool = False
    ) -> None:
        """Save every ``checkpoint_every`` steps (rank 0 writes; every rank holds the same state)."""
        if self.checkpoint_dir is None:
            return
        due = force or (self.checkpoint_every and self.step % self.checkpoint_every == 0)
        if not due or self.rank != 0:
            return
        state: dict[str, Any] = {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "step": self.step,
            "data_position": {"step": self.step},
            "task": self.task,
            "generation": self.generation,
            "world_size": self.world_size,
        }
        path = checkpoint.save(self.checkpoint_dir, self.step, state)
        self.channel.send(
            CheckpointReport(
                task=self.task, generation=self.generation, rank=self.rank, step=self.step, path=str(path)
            )
        )

    def finish(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> str:
        """Save the final state and report the parameters' digest; returns it."""
        self.maybe_checkpoint(model, optimizer, force=True)
        value = checkpoint.digest(model)
        self.channel.send(
            DoneReport(
                task=self.task, generation=self.generation, rank=self.rank, step=self.step, digest=value
            )
        )
        return value

    # ------------------------------------------------------------------ failures
    def forward_exception(self, exc: BaseException) -> None:
        self.trace("exception", error=type(exc).__name__)
        self.channel.send(
            ExceptionReport(
                task=self.task,
                generation=self.generation,
                rank=self.rank,
                step=self.step,
                error_type=type(exc).__name__,
                message=str(exc)[:2000],
                kind=classify_exception(exc).value,
                traceback="".join(traceback.format_exception(exc))[-4000:],
            )
        )

    def _fault_report(self, report: FaultReport) -> None:
        self.trace("fault", action=report.action, step=report.step)
        self.channel.send(report)

    def close(self) -> None:
        if dist.is_available() and dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
        self.channel.close()

    def __enter__(self) -> Session:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is not None and not isinstance(exc, (KeyboardInterrupt, SystemExit)):
            self.forward_exception(exc)
        self.close()


def init(**kwargs: Any) -> Session:
    """The session for this worker, from the environment its agent gave it."""
    return Session(**kwargs)

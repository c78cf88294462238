"""The training session: what a worker wraps around an ordinary data-parallel training loop.

It sets torch.distributed up from the agent's environment (the task's rendezvous store, with a
prefix per generation), tells the worker which samples each step trains on, reports every
iteration, forwards exceptions before the process dies, and saves and restores checkpoints
(model, optimizer, step, data position). Run without an agent, it is a world of one.
See docs/training-library.md for the diff against a plain DDP script.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import timedelta
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
import torch.distributed as dist

from unicron.core.livespecs import FaultSpec
from unicron.core.protocol import (
    CheckpointReport,
    DoneReport,
    FaultReport,
    Membership,
    Phase,
    ready_key,
)
from unicron.core.settings import Settings
from unicron.core.workerenv import KEYS, WorkerEnv, unmanaged_identity
from unicron.train import checkpoint, gradsync, membership
from unicron.train.channel import ReportChannel, exception_report
from unicron.train.data import shard
from unicron.train.faults import FaultInjector
from unicron.train.iteration import Iteration
from unicron.train.loader import MapDataset, StepData, step_data
from unicron.train.progress import ProgressReporter
from unicron.train.state import Stateful, TrainState, check_registrable, step_schedulers
from unicron.train.taskstore import TaskStore
from unicron.train.tracefile import TraceFile


class Session:
    def __init__(
        self,
        env: Mapping[str, str] | None = None,
        *,
        iterations: int | None = None,
        checkpoint_dir: str | Path | None = None,
        checkpoint_every: int | None = None,
        timeout_s: float | None = None,
    ) -> None:
        raw = os.environ if env is None else env
        # Under a Unicron agent the worker contract (core.workerenv) says everything; under
        # torchrun (the baseline we compare with) its RANK/WORLD_SIZE and restart count do.
        self.under_torchrun = KEYS["task"] not in raw and "TORCHELASTIC_RUN_ID" in raw
        contract = WorkerEnv.from_env(raw) or WorkerEnv.from_env({**raw, **unmanaged_identity(raw)})
        assert contract is not None
        self.contract, self.store_address = contract, contract.store
        self.trace = TraceFile(contract.trace_file, lambda: {**self._identity(), "pid": self.progress.pid})
        self.task, self.generation = contract.task, contract.generation
        self.rank, self.world_size, self.local_rank = contract.rank, contract.world_size, contract.local_rank
        self.node = contract.node or socket.gethostname()
        self.iterations = contract.iterations or iterations or 0
        self.checkpoint_every = contract.checkpoint_every or checkpoint_every or 0
        directory = contract.checkpoint_dir or (str(checkpoint_dir) if checkpoint_dir else "")
        self.checkpoint_dir = Path(directory) if directory else None
        # The in-memory tier: a copy in the node's RAM (tmpfs), read back far faster than the
        # persistent checkpoint when a process restarts on the same node.
        self.host_dir = (
            checkpoint.host_dir(self.checkpoint_dir, self.node, contract.host_checkpoint_root)
            if self.checkpoint_dir is not None and contract.host_checkpoints
            else None
        )
        self.limits = limits = Settings()
        self.timeout = timedelta(seconds=contract.pg_timeout_s or timeout_s or limits.process_group_timeout_s)
        self.channel = ReportChannel(contract.agent_socket)
        faults = [FaultSpec.model_validate(f) for f in contract.faults or []]
        self.faults = FaultInjector(faults, self.rank, self.generation, self._fault_report, self.task)
        self.faults.folders = (self.checkpoint_dir, self.host_dir)
        self._micro_batches = 0
        self._settle_pending = False  # the group was (re)formed: settle who holds what first
        self.data: StepData | None = None
        self.store: TaskStore | None = None
        self.progress = ProgressReporter(self.channel, contract.stack_file, lambda: self.generation)
        self.in_process = contract.recovery == "in_process" and bool(self.store_address)  # needs the store
        wait_s = contract.membership_timeout_s or limits.membership_timeout_s
        self.membership_timeout = timedelta(seconds=wait_s)
        self.step, self.stop_requested = 0, False
        self._started, self._resumed = False, False  # start() and resume() were called
        self.extras: dict[str, Stateful] = {}  # registered objects, kept with the model
        self._buckets: gradsync.Buckets | None = None  # overlapped gradient reduction
        self._settled_step = 0  # the last step in which a re-formed group settled its samples

    # ------------------------------------------------------------------ set-up
    def start(self) -> Session:
        """Join the task's process group (nothing to join in a world of one)."""
        if self._started:
            return self
        self._started = True
        if threading.current_thread() is threading.main_thread():
            # The agent stops workers with SIGTERM: finish the step, checkpoint, exit cleanly.
            signal.signal(signal.SIGTERM, self._on_stop)
        self.trace("started", node=self.node)
        # Before any group, or destroying it leaves it alive (and aborting at exit): pytorch-notes.md
        import torch._dynamo  # noqa: F401

        if self.world_size > 1 and self.under_torchrun:
            dist.init_process_group("gloo", timeout=self.timeout)  # env:// from torchrun
        elif self.world_size > 1 or self.contract.spare:
            if not self.store_address:
                raise RuntimeError("UNICRON_STORE is not set: run workers through a Unicron agent")
            self.store = TaskStore(self.store_address, self.task, self.timeout, self.limits.store_reconnect_s)
            self.faults.claim = self.store.claim
            joining = self.contract.joining
            if self.contract.spare:
                self._wait_to_be_used()
                joining = True
            if joining:
                # A newcomer to live replicas: announce readiness; the coordinator then tells the
                # replicas to make room at their next step boundary.
                self.store.raw.set(ready_key(self.task, self.generation, self.rank), "1")
            self._join()
        return self

    def _join(self) -> None:
        """Form this generation's group with its members. When the coordinator re-formed it
        before they all arrived (a member failed on the way), follow the memberships that
        succeed it instead of waiting for the missing member until the group's timeout."""
        assert self.store is not None
        self.progress.at(self.step + 1, Phase.REJOIN, "join")
        while not self.store.arrive(self.generation, self.rank, self.world_size, self.timeout):
            self.faults.rejoining()  # on the way into the generation that follows
            self._adopt(self.store.posted(self.generation))
        membership.join(self.store.raw, self.task, self.generation, self.rank, self.world_size, self.timeout)

    def _adopt(self, new: Membership) -> None:
        """Take this worker's identity in the membership that follows its generation."""
        if self.rank not in new.ranks:
            self.trace("left", generation=new.generation)
            raise SystemExit(0)  # not in the new membership: this worker's part is over
        self.generation, self.rank, self.world_size = new.generation, new.ranks[self.rank], new.world_size
        self.faults.rank, self.faults.generation = self.rank, self.generation

    def _wait_to_be_used(self) -> None:
        """A hot spare: loaded and connected, it waits for the coordinator to give it a
        newcomer's identity; then it joins like any newcomer (state from a live replica)."""
        assert self.store is not None
        self.trace("spare_waiting")
        identity = self.store.wait_to_be_used(
            self.rank, lambda: self.stop_requested, self.membership_timeout.total_seconds()
        )
        if identity is None:
            raise SystemExit(0)  # not needed after all, or its task is gone
        self.generation, self.rank = int(identity["generation"]), int(identity["rank"])
        self.world_size = int(identity["world_size"])
        self.faults.rank, self.faults.generation = self.rank, self.generation
        self.trace("spare_used")

    # ------------------------------------------------------------------ the loop
    def register(self, name: str, obj: Stateful) -> None:
        """Keep ``obj``'s state (anything with ``state_dict()``/``load_state_dict()`` that is the
        same on every replica) with the model's, before ``resume``: ``state.py``. An LR scheduler
        is stepped by the session after each optimizer step (do not call its ``step()``)."""
        if self._resumed:
            raise RuntimeError(f"session.register({name!r}, ...) after session.resume(...): register first")
        check_registrable(name, obj, self.extras)
        self.extras[name] = obj

    def resume(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
        """Load the latest checkpoint, if any; return the step it holds (0 without one)."""
        self._resumed, train = True, TrainState(model, optimizer, self.extras)  # refuses a DDP model
        found = checkpoint.load_nearest(self.checkpoint_dir, self.host_dir) if self.checkpoint_dir else None
        if found is not None:
            train.load_state_dict(found.state)
            self.step = int(found.state["step"])
            self.trace("resumed", step=self.step, source=found.source, skipped=len(found.skipped))
            self.channel.send(found.report(self.task, self.generation, self.rank))
        if dist.is_initialized():
            # Members check they hold the same state; a newcomer joining live replicas gets
            # theirs here instead of the (older) checkpoint.
            self._first_agreement(model, optimizer)
        return self.step

    def _first_agreement(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Agree once the group formed; a newcomer (or spare) whose live peers lose a member
        meanwhile follows the group the coordinator re-forms, as the survivors do."""
        newcomer = self.contract.joining or self.contract.spare
        try:
            self._agree(model, optimizer, reformed=newcomer)
            return
        except Exception as exc:
            self._recoverable(exc, last=not newcomer)  # a launch has no live group to follow
        self._rejoin(model, optimizer)

    def _agree(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, reformed: bool) -> bool:
        """Members settle on one state (``membership.agree``); returns whether state had to be
        copied. What this rank received, and any transfer it rejected, goes to the trace.
        ``reformed``: a group re-formed around live replicas (not a launch), where the faults of
        a recovery are injected."""
        self.progress.at(self.step + 1, Phase.COLLECTIVE, "agree")
        if reformed:
            self.faults.agreeing()
        train = TrainState(model, optimizer, self.extras)
        sending = self.faults.transferring if reformed else (lambda: None)
        agreed = membership.agree(train, self.step, self.node, self.faults.transfer_damaged, sending)
        self.step = agreed.step
        self._settle_pending = True
        for source in agreed.rejected:
            self.trace("state_rejected", step=self.step, source=source)
        if agreed.received:
            self.trace("state_from_replica", step=self.step, source=agreed.source, same_node=agreed.same_node)
        return agreed.copied

    def _on_stop(self, signum: int, frame: Any) -> None:
        self.trace("sigterm")
        self.stop_requested = True

    def steps(self) -> Iterator[int]:
        """The steps still to train, 1-based, after the resumed one; ends early when the
        worker is asked to stop, so that ``finish`` checkpoints at a step boundary."""
        while self.step < self.iterations and not self.stop_requested:
            yield self.step + 1

    def configure_data(
        self,
        global_batch: int,
        micro_batch: int,
        dataset: MapDataset,
        *,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        seed: int = 0,
        shuffle: bool = True,
        drop_last: bool = True,
    ) -> None:
        """Declare the data once: ``global_batch`` samples per optimizer step, in micro-batches of
        ``micro_batch`` per forward/backward, from a map-style ``dataset`` batched by
        ``collate_fn`` (``default_collate`` if None); ``seed``, ``shuffle`` and ``drop_last`` as
        ``DistributedSampler`` takes them (``data.py`` says how the order matches it)."""
        self.data = step_data(dataset, global_batch, micro_batch, collate_fn, seed, shuffle, drop_last)

    def train_step(
        self,
        step: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        loss_of: Callable[[Any], torch.Tensor],
        *,
        max_grad_norm: float | None = None,
    ) -> float:
        """One optimizer step run by the library: this rank's micro-batches (``loss_of(batch)``
        returns the mean loss of a micro-batch, as ``collate_fn`` built it), the gradient
        all-reduce, clipping to ``max_grad_norm`` (the global norm of the reduced gradients, as
        ``clip_grad_norm_`` after DDP's backward), the update. Returns the mean loss of this
        rank's samples. Owning the loop lets the library recover a failed step in-process with
        exactly the same global batch."""
        if self.data is None:
            raise RuntimeError("call configure_data(...) before train_step(...)")
        if self._membership_changed():
            # A planned change (a newcomer, a resize) takes effect at a step boundary: no work lost.
            self._rejoin(model, optimizer)
        ids = self.data.stream.batch(step)
        share = self._settle(step, ids, model, optimizer)
        if share is None:
            return 0.0  # the state taken from a replica at a rebuild already holds this step
        with self.iteration(step) as it:
            self._micro_batches = -(-len(share) // self.data.stream.micro_batch)
            contributed = self._accumulate(share, loss_of, it, arm=self._overlap(model, step))
            contributed, done = self._reduce_or_recover(step, ids, contributed, model, optimizer, loss_of, it)
            self.trace("samples", step=step, ids=contributed)  # the ledger: reduced, so in the step
            self.faults.after_reduce(step)
            if not done:
                if max_grad_norm is not None:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
                optimizer.step()
                step_schedulers(self.extras, self.step)  # (the step in progress is self.step + 1)
            optimizer.zero_grad(set_to_none=True)
        return it.loss / it.samples if it.samples else 0.0

    def _settle(
        self, step: int, ids: list[int], model: torch.nn.Module, optimizer: torch.optim.Optimizer
    ) -> list[int] | None:
        """This rank's samples of ``step``, at its start. After a group (re)formed this is the
        members' first collective: a peer failing in it (a newcomer that dies or hangs at once)
        is recovered from in-process like a failure in the all-reduce."""
        for attempt in range(4):
            if self.step >= step:
                return None
            try:
                return self._my_part(step, ids, held=[])
            except Exception as exc:
                self._recoverable(exc, last=attempt == 3)
            self._rejoin(model, optimizer)  # outside the except block: see _reduce_or_recover
        raise AssertionError("unreachable")

    def _recoverable(self, exc: Exception, last: bool) -> None:
        """Forward a failed collective; re-raise it on the ``last`` attempt or without in-process recovery."""
        if not self.in_process or last or self.store is None:
            raise exc
        self.forward_exception(exc)

    def _reduce_or_recover(
        self,
        step: int,
        ids: list[int],
        contributed: list[int],
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        loss_of: Callable[[Any], torch.Tensor],
        it: Iteration,
    ) -> tuple[list[int], bool]:
        """Reduce the gradients; if a peer fails meanwhile, rebuild the group with the survivors
        and finish the step with the same global batch. Returns the samples this rank
        contributed and whether the step was completed by taking state from a replica."""
        self.faults.before_reduce(step)
        for attempt in range(4):
            try:
                self.progress.at(step, Phase.COLLECTIVE, "all_reduce", len(it.marks))
                self._reduce(model)
                return contributed, False
            except Exception as exc:
                self._recoverable(exc, last=attempt == 3)
            # Outside the except block: the exception's frames (inside torch.distributed) would
            # keep the failed group alive, and its sockets open, so peers would never notice.
            if self._rejoin(model, optimizer):
                # Members disagreed: state came from a replica; what was accumulated is void.
                for p in model.parameters():
                    p.grad = None
                if self.step >= step:
                    return [], True  # the copied state already holds this step
                contributed = []
            # Survivors keep what they computed; the samples nobody holds are shared out.
            mine = self._my_part(step, ids, held=contributed)
            self.trace("recompute", step=step, samples=len(mine))
            contributed += self._accumulate(mine, loss_of, it)
        raise AssertionError("unreachable")

    def _my_part(self, step: int, ids: list[int], held: list[int]) -> list[int]:
        """This rank's samples of ``step``. Right after the group was (re)formed, members tell
        each other which of the step's samples they already hold (the ledger: accumulated in
        gradients, not yet reduced; nothing for a member that was at the step boundary or is
        new) and share out the rest; else the step's samples are split evenly. A shard formula
        cannot do this: with a failure during recovery, or a member that saw the new membership
        at the boundary while another was inside the step, what each holds is not its old shard."""
        if not self._settle_pending or self.world_size == 1 or not dist.is_initialized():
            return shard(ids, self.rank, self.world_size)
        self._settle_pending = False
        self.progress.at(step, Phase.COLLECTIVE, "settle")
        mine, held_counts = membership.settle(ids, held)
        self.trace("ledger", step=step, held=held_counts, mine=len(mine))
        self._settled_step = step
        return mine

    def _membership_changed(self) -> bool:
        """Whether the coordinator posted a new membership (never while it is unreachable)."""
        return self.in_process and self.store is not None and self.store.membership_changed(self.generation)

    def _rejoin(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> bool:
        """Leave the current group, wait for the coordinator's next membership, join it, agree.
        A member lost meanwhile (its group fails to form or to agree) is a failure during the
        recovery: the coordinator re-forms the group again, and this member follows. Returns
        whether state had to be copied from a replica."""
        assert self.store is not None
        started = time.time()
        for attempt in range(4):
            membership.leave()  # outside the except block: see _reduce_or_recover
            self.progress.at(self.step + 1, Phase.REJOIN)
            self.faults.rejoining()
            self._adopt(self.store.next_membership(self.generation, self.membership_timeout))
            try:
                self._join()
                copied = self._agree(model, optimizer, reformed=True)
                break
            except Exception as exc:
                self._recoverable(exc, last=attempt == 3)
        self.trace("rejoined", seconds=time.time() - started, world=self.world_size, copied=copied)
        return copied

    def _overlap(self, model: torch.nn.Module, step: int) -> Callable[[], None] | None:
        """Arms the gradient buckets for the step's last micro-batch, or None: a world of one, or
        a step in which the group settled who holds what (it re-formed: every member knows, as
        the settle is their first collective, so all reduce one flat buffer: collectives match)."""
        if self.world_size == 1 or self._settled_step == step or not dist.is_initialized():
            return None
        self._buckets = gradsync.Buckets.of(model, self._buckets)
        self._buckets.before_first = lambda: self.faults.before_reduce(step)
        return self._buckets.arm

    def _accumulate(
        self,
        ids: list[int],
        loss_of: Callable[[Any], torch.Tensor],
        it: Iteration,
        arm: Callable[[], None] | None = None,
    ) -> list[int]:
        # Each sample's gradient counts 1/B (B: the step's samples, fewer in an epoch's last step
        # without drop_last): the SUM over ranks is then the global mean for any number of
        # ranks, and work can move between ranks without rescaling.
        assert self.data is not None
        stream = self.data.stream
        step_samples = len(stream.batch(it.step))
        if arm is not None and not ids:
            arm()  # nothing to compute, but the same collectives as the others
        for start in range(0, len(ids), stream.micro_batch):
            chunk = ids[start : start + stream.micro_batch]
            if arm is not None and start + stream.micro_batch >= len(ids):
                arm()  # the last micro-batch: its backward reduces the gradient buckets
            self.progress.at(it.step, Phase.COMPUTE, micro_batch=len(it.marks))
            loss = loss_of(self.data.fetch(chunk))
            (loss * (len(chunk) / step_samples)).backward()  # type: ignore[no-untyped-call]
            it.record(loss.item(), len(chunk))
        return list(ids)

    def _reduce(self, model: torch.nn.Module) -> None:
        """Sum the gradients over the ranks (``gradsync``); abandoned once the coordinator posts
        a new membership (a peer was declared dead or hung), when this rank recovers in place."""
        if self.world_size == 1:
            return
        store, generation = self.store, self.generation
        watch = None if not self.in_process or store is None else lambda: store.peers_failed(generation)
        if self._buckets is not None and self._buckets.armed:
            self._buckets.finish(watch)  # launched during the last backward
        else:
            gradsync.all_reduce_gradients(model, watch)

    @contextlib.contextmanager
    def iteration(self, step: int) -> Iterator[Iteration]:
        """Time and report one optimizer step; the step counts once the block completes."""
        it = Iteration(step, self._micro_batches, lambda: self.faults.before_last_micro_batch(step))
        self.faults.step_started(step)  # inside the step's time: a slowed rank computes slowly
        yield it
        self.step = step
        self.channel.send(it.report(self.task, self.generation, self.rank))

    def maybe_checkpoint(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, force: bool = False
    ) -> None:
        """Save every ``checkpoint_every`` steps (rank 0 writes; every rank holds the same state)."""
        if self.checkpoint_dir is None:
            return
        due = force or (self.checkpoint_every and self.step % self.checkpoint_every == 0)
        host = self.host_dir if self.local_rank == 0 else None  # one in-memory copy per node
        if not due or (self.rank != 0 and host is None):
            return
        self.progress.at(self.step, Phase.CHECKPOINT)
        where = {"task": self.task, "generation": self.generation, "world_size": self.world_size}
        state = checkpoint.state_of(TrainState(model, optimizer, self.extras), self.step, **where)
        path = checkpoint.save_step(self.checkpoint_dir, host, self.step, state, persistent=self.rank == 0)
        if path is not None:
            self.channel.send(CheckpointReport(**self._identity(), step=self.step, path=str(path)))

    def finish(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> str:
        """Save the final state and report the parameters' digest; returns it."""
        self.maybe_checkpoint(model, optimizer, force=True)
        value = checkpoint.digest(model)
        self.channel.send(DoneReport(**self._identity(), step=self.step, digest=value))
        return value

    # ------------------------------------------------------------------ failures
    def forward_exception(self, exc: BaseException) -> None:
        """Send ``exc`` to the coordinator, classified (the ``with`` block does it on the way out)."""
        self.trace("exception", error=type(exc).__name__)
        self.channel.send(exception_report(exc, self.task, self.generation, self.rank, self.step))

    def _identity(self) -> dict[str, Any]:
        return {"task": self.task, "generation": self.generation, "rank": self.rank}

    def _fault_report(self, report: FaultReport) -> None:
        self.trace("fault", action=report.action, step=report.step)
        self.channel.send(report)

    def close(self) -> None:
        """Leave the process group and close the reports (``with init() as session`` does it)."""
        if dist.is_available() and dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
        self.progress.close()
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

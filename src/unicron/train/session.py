"""The training session: what a worker wraps around an ordinary data-parallel training loop.

It sets torch.distributed up from the agent's environment (the task's rendezvous store, with a
prefix per generation), tells the worker which samples each step trains on, reports every
iteration, forwards exceptions before the process dies, and saves and restores checkpoints
(model, optimizer, step, data position). Run without an agent, it is a world of one.
See docs/training-library.md for the diff against a plain DDP script.
"""

from __future__ import annotations

import atexit
import gc
import os
import signal
import socket
import sys
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
    DoneReport,
    FaultReport,
    Membership,
    Phase,
)
from unicron.core.settings import Settings
from unicron.core.workerenv import KEYS, WorkerEnv, unmanaged_identity
from unicron.train import checkpoint, devices, exporting, membership, porting, sharded
from unicron.train.channel import ReportChannel, exception_report
from unicron.train.faults import FaultInjector
from unicron.train.fencing import Fence
from unicron.train.fingerprint import ReplicasDiverged
from unicron.train.groups import Groups
from unicron.train.iteration import StopRequested
from unicron.train.loader import MapDataset, StepData, step_data
from unicron.train.metric import Metric
from unicron.train.peers import Peers
from unicron.train.progress import ProgressReporter
from unicron.train.rowdigest import layout_digest
from unicron.train.saving import Saving
from unicron.train.state import Stateful, TrainState, check_registrable
from unicron.train.steploop import Loader, StepLoop
from unicron.train.sumtest import SPIKE_WINDOWS
from unicron.train.taskstore import TaskStore
from unicron.train.tracefile import TraceFile

# A step boundary takes the answer of the check that ended the step's reduce (``declared_failed``)
# if that question was sent this recently, instead of asking the store again (``TaskStore``).
BOUNDARY_REUSE_S = 0.05


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
        # The store's address, then where another coordinator would serve it (comma-separated).
        self.contract, self.store_address = contract, contract.store_addresses()
        self.trace = TraceFile(contract.trace_file, lambda: {**self.identity(), "pid": self.progress.pid})
        self.task, self.generation = contract.task, contract.generation
        self.rank, self.world_size, self.local_rank = contract.rank, contract.world_size, contract.local_rank
        self.node = contract.node or socket.gethostname()
        self.iterations = contract.iterations or iterations or 0
        # Under an agent the task file's run.iterations is the one count: rank 0 says so, once.
        given = iterations not in (None, contract.iterations)
        if contract.task and contract.iterations and given and contract.rank == 0:
            print(
                f"unicron: task {contract.task} trains {contract.iterations} steps (its task file's "
                f"run.iterations); this script's iterations={iterations} applies only without an agent",
                file=sys.stderr,
                flush=True,
            )
        self.checkpoint_every = contract.checkpoint_every or checkpoint_every or 0
        directory = contract.checkpoint_dir or (str(checkpoint_dir) if checkpoint_dir else "")
        self.checkpoint_dir = Path(directory) if directory else None
        self.host_dir = in_memory_tier(contract, self.checkpoint_dir, self.node)
        self.limits = limits = Settings()
        wait = contract.storage_wait_s
        self.storage_wait_s = limits.storage_wait_s if wait is None else wait
        self.timeout = timedelta(seconds=contract.pg_timeout_s or timeout_s or limits.process_group_timeout_s)
        self.replica_size = contract.replica_size
        # The model's device, for the user's ``model.to(session.device)`` (``devices.py``).
        self.device = devices.worker_device(self.local_rank)
        self.groups = Groups(self.task, self.replica_size, self.timeout, devices.backend(self.device))
        self.saving = Saving(self, contract.checkpoint_async)  # after the device: see Saving
        self.fence = Fence(
            self.store_address or "",
            self.task,
            contract.store_key or "",
            limits.commit_confirm_s,
            lambda: (self.generation, self.rank, self.step),
            self.groups.replica_worst,
            contract.store_file,
        )
        self.channel = ReportChannel(contract.agent_socket)
        faults = [FaultSpec.model_validate(f) for f in contract.faults or []]
        self.faults = FaultInjector(
            faults, self.rank, self.generation, self._fault_report, self.task, contract.agent_pid
        )
        self.faults.folders = (self.checkpoint_dir, self.host_dir)
        self.settle_pending = False  # the group was (re)formed: settle who holds what first
        self.agreed_step = 0  # the step at which the members last agreed on one state (``_agree``)
        self.data: StepData | None = None
        self.running: StepLoop | None = None  # the `session.steps(...)` loop in progress
        # The windows of the values spikes are judged by (``sumtest.py``: the gradient norm's, each
        # checked metric's) of the checkpoint resumed from, then of the step loop once it ended:
        # what the checkpoints it writes hold.
        self.spike_windows: dict[str, list[float]] = {}
        self.digest: str | None = None  # the final parameters' digest, once the steps ran out
        self.store: TaskStore | None = None
        self.progress = ProgressReporter(contract.position_file, contract.stack_file, lambda: self.generation)
        self.in_process = contract.recovery == "in_process" and bool(self.store_address)  # needs the store
        wait_s = contract.membership_timeout_s or limits.membership_timeout_s
        self.membership_timeout = timedelta(seconds=wait_s)
        self.step, self.stop_requested = 0, False
        self._started, self._resumed = False, False  # start() was called, steps() loaded the state
        self.extras: dict[str, Stateful] = {}  # registered objects, kept with the model
        self.metrics: list[Metric] = []  # reduced with the gradients each step (``metric.py``)

    # ------------------------------------------------------------------ set-up
    def start(self) -> Session:
        """Join the task's process group (nothing to join in a world of one). A default group
        that the script formed itself is refused with a ``PortingError`` naming the fix."""
        if self._started:
            return self
        porting.refuse_existing_group()
        self._started = True
        if threading.current_thread() is threading.main_thread():
            # The agent stops workers with SIGTERM: finish the step, checkpoint, exit cleanly.
            signal.signal(signal.SIGTERM, self._on_stop)
        self.trace("started", node=self.node)
        # The interpreter's last collection, as the process exits, walks every object that
        # importing torch made (millions): 0.5-0.8 s of CPU after the script's end, added to each
        # worker's exit, so to a task's end and to every stop a relaunch waits for. Frozen at exit,
        # they are left to the process's end (Python promises no finalizer then). Registered here,
        # it runs after the exit handlers the script registers later (the last in runs first).
        atexit.unregister(gc.freeze)  # (once, however many sessions the process starts)
        atexit.register(gc.freeze)
        # Before any group, or destroying it leaves it alive (and aborting at exit): docs/pytorch-notes.md
        import torch._dynamo

        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)  # NCCL's communicators and FSDP use the current one
        if self.world_size > 1 and self.under_torchrun:
            dist.init_process_group(self.groups.backend, timeout=self.timeout)  # env:// from torchrun
            self.groups.peers = Peers.world()
        elif self.world_size > 1 or self.contract.spare:
            if not self.store_address:
                raise RuntimeError("UNICRON_STORE is not set: run workers through a Unicron agent")
            if not self.contract.store_key:
                raise RuntimeError("UNICRON_STORE_KEY is not set: run workers through a Unicron agent")
            key, reconnect_s = self.contract.store_key, self.limits.store_reconnect_s
            self.store = TaskStore(
                self.store_address, self.task, key, self.timeout, reconnect_s, self.contract.store_file
            )
            self.faults.claim = self.store.claim
            joining = self.contract.joining
            if self.contract.spare:
                self._wait_to_be_used()
                joining = True
            if joining:
                # A newcomer to live replicas: announce readiness; the coordinator then tells the
                # replicas to make room at their next step boundary.
                self.store.announce_ready(self.generation, self.rank)
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
        self.groups.join(self.store.raw, self.generation, self.rank, self.world_size)

    @property
    def mesh(self) -> Any:
        """The replica's device mesh, to shard the model over (``fully_shard(module,
        mesh=session.mesh)``); None when the task's replicas are of one rank (``run.replica_size``).
        The session sums the shards' gradients over the replicas itself (see ``sharded.py``)."""
        self.start()
        return self.groups.mesh()

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
        same on every replica) with the model's, before ``steps``: ``state.py``. An LR scheduler
        is stepped by the session after each optimizer step (a ``step()`` call of your own is
        refused: ``loopguard.py``), except a ``ReduceLROnPlateau``, which needs the value it
        watches: step it after the micro-batch loop with a global one (``metric``)."""
        if self._resumed:
            raise RuntimeError(f"session.register({name!r}, ...) in session.steps(...): register before")
        check_registrable(name, obj, self.extras)
        checkpoint.check_plain(name, obj.state_dict())
        self.extras[name] = obj

    def metric(self, name: str, checked: bool = False) -> Metric:
        """A value averaged over each step's global batch, the same on every worker at any world
        size (``metric.py``): ``add`` each micro-batch's value (its loss) inside ``for batch in
        loader:``, read ``value`` after the loop. Declare it before ``steps``, on every worker:
        its sums are reduced with the gradients. ``checked``: the value is tested with the
        gradient sum, before the step is applied (``sumtest.py``: not finite, or a spike)."""
        if self._resumed:
            raise RuntimeError(f"session.metric({name!r}) in session.steps(...): declare it before")
        if self.replica_size > 1:
            raise NotImplementedError(
                f"session.metric({name!r}) with replicas of several ranks (run.replica_size "
                f"{self.replica_size}): not supported yet (its sums would have to be reduced over "
                "the replica and its peers with the gradients); use it with replicas of one rank"
            )
        if not name.isidentifier() or any(m.name == name for m in self.metrics):
            taken = sorted(m.name for m in self.metrics)
            raise ValueError(f"session.metric: {name!r} must be a new identifier (taken: {taken})")
        self.metrics.append(Metric(name, checked))
        return self.metrics[-1]

    def loader(
        self,
        dataset: MapDataset,
        global_batch: int,
        *,
        batch_size: int,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = True,
    ) -> Loader:
        """The data, in place of ``DistributedSampler`` + ``DataLoader``: ``global_batch`` samples
        per optimizer step, in micro-batches of ``batch_size`` per forward/backward, from a
        map-style ``dataset`` batched by ``collate_fn`` (``default_collate`` if None); ``shuffle``,
        ``seed`` and ``drop_last`` as ``DistributedSampler`` takes them (``data.py`` says how the
        order matches it). Iterate it inside ``steps``: ``steploop.py``."""
        if self.data is not None:
            raise RuntimeError("session.loader(...) was called twice: one loader per session")
        self.data = step_data(dataset, global_batch, batch_size, collate_fn, seed, shuffle, drop_last)
        return Loader(self, self.data)

    def steps(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        pretrained: str | Path | None = None,
    ) -> Iterator[int]:
        """The steps still to train, 1-based: first the latest checkpoint (or a live replica's
        state) is loaded into ``model``, ``optimizer`` and the registered objects; each step
        then ends with the registered schedulers stepped and a checkpoint when one is due. Ends
        early when the worker is asked to stop; at the end the final state is saved and its
        digest reported (``self.digest``). ``pretrained``: a folder that the final model is also
        written into with its own ``save_pretrained`` (a Hugging Face model), by rank 0, before
        the task is reported done (``exporting.py``); checked before the first step."""
        if self.data is None:
            raise RuntimeError("create the loader (session.loader(...)) before session.steps(...)")
        export = None if pretrained is None else exporting.checked(model, pretrained)
        self.start()
        try:
            self._resume(model, optimizer)
        except StopRequested:
            return  # asked to stop before this process trained a step: nothing of its own to save
        self.running = loop = StepLoop(self, model, optimizer, self.data)
        try:
            while self.step < self.iterations:
                changed, stop = self.at_boundary()
                if stop:
                    break
                step = self.step + 1
                if loop.begin(step, changed):
                    yield step
                    loop.end(step)
        finally:
            loop.close()
            self.running = None
            # (the final state, saved below, holds it too: a worker stopped at a boundary for a
            # relaunch saves the state the relaunch resumes from there)
            self.spike_windows = loop.spike_windows()
        self.digest = self._finish(model, optimizer, export)

    def _resume(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Load the latest checkpoint, if any, then agree with the live members on one state."""
        self._resumed, train = (
            True,
            TrainState(model, optimizer, self.extras),
        )  # refuses bad models, optimizers
        found = self._load_checkpoint(train)
        if found is not None:
            self.step = int(found.state["step"])
            windows = found.state.get(SPIKE_WINDOWS, {})
            self.spike_windows = {str(k): [float(v) for v in values] for k, values in windows.items()}
            self.trace("resumed", step=self.step, source=found.source, skipped=len(found.skipped))
            self.channel.send(found.report(self.task, self.generation, self.rank))
        if self.groups.peers is not None:
            # Members check they hold the same state; a newcomer joining live replicas gets
            # theirs here instead of the (older) checkpoint.
            self._first_agreement(model, optimizer)

    def _load_checkpoint(self, train: TrainState) -> checkpoint.Restored | None:
        """Load the nearest intact checkpoint into ``train``: a sharded replica's ranks together
        (``shardedcheckpoint.restore_nearest``), else each rank on its own."""
        if self.checkpoint_dir is None:
            return None
        if train.sharded:  # its reader is imported on first use (checkpoint.py says why)
            from unicron.train import shardedcheckpoint

            return shardedcheckpoint.restore_nearest(train, self.checkpoint_dir, self.host_dir)
        found = checkpoint.load_nearest(self.checkpoint_dir, self.host_dir)
        if found is not None:
            train.load_state_dict(found.state, whole=True)
        return found

    def _first_agreement(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Agree once the group formed; a newcomer (or spare) whose live peers lose a member
        meanwhile follows the group the coordinator re-forms, as the survivors do."""
        newcomer = self.contract.joining or self.contract.spare
        try:
            self._agree(model, optimizer, reformed=newcomer)
            return
        except ReplicasDiverged:
            raise
        except Exception as exc:
            self.recoverable(exc, last=not newcomer)  # a launch has no live group to follow
        self.rejoin(model, optimizer)

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
        peers = self.groups.peers
        if peers is None:
            raise ConnectionResetError("the process group is gone: connection to peers broken")
        damage = self.faults.transfer_damaged
        try:
            # (each shard position agrees apart: with replicas of several ranks none may raise alone)
            live = reformed and not self.groups.replicated
            agreed = membership.agree(peers, train, self.step, self.node, damage, sending, live)
        except ReplicasDiverged as exc:  # no live state trusted: the task goes back to its checkpoint
            self.trace("replicas_diverged", step=self.step, odd=sorted(exc.odd), why=str(exc))
            raise
        self.step = self.agreed_step = agreed.step
        self.settle_pending = True
        for source in agreed.rejected:
            self.trace("state_rejected", step=self.step, source=source)
        if agreed.received:
            self.trace("state_from_replica", step=self.step, source=agreed.source, same_node=agreed.same_node)
        return agreed.copied

    def _on_stop(self, signum: int, frame: Any) -> None:
        self.trace("sigterm")
        late = self.faults.late_stop()  # fault injection: the request taken ``seconds`` late
        if late is None:
            self.stop_requested = True
            return
        timer = threading.Timer(late.seconds, self._take_stop_late, (late,))
        timer.daemon = True
        timer.start()

    def _take_stop_late(self, fault: FaultSpec) -> None:
        self.faults.announce(fault, self.step)
        self.stop_requested = True

    def recoverable(self, exc: Exception, last: bool) -> None:
        """Forward a failed collective; re-raise it on the ``last`` attempt or without in-process
        recovery. A worker asked to stop does neither: its peers most likely stopped a step
        boundary earlier (each takes the request at its own boundary), and ``rejoin`` then ends
        the step in progress (``StopRequested``)."""
        if self.stop_requested:
            return
        if not self.in_process or last or self.store is None:
            raise exc
        self.forward_exception(exc)

    def at_boundary(self) -> tuple[bool, bool]:
        """At a step boundary: whether the coordinator posted a new membership (never while it
        is unreachable), and whether this worker is asked to stop; the ranks of a replica take
        both together (``Groups.replica_agrees``)."""
        store = self.store if self.in_process else None
        posted = store is not None and store.membership_changed(self.generation, BOUNDARY_REUSE_S)
        writing = self.saving.writing
        changed, stop, still_writing = self.groups.replica_agrees(posted, self.stop_requested, writing)
        if self.saving.background is not None and not still_writing:
            self.saving.commit_background()  # every rank's write is done: commit it together
        return changed, stop

    def declared_failed(self) -> bool:
        """Whether the coordinator has declared this worker failed since its generation formed."""
        store = self.store
        return self.in_process and store is not None and store.declared_failed(self.generation, self.rank)

    def rejoin(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> bool:
        """Leave the current group, wait for the coordinator's next membership, join it, agree.
        A member lost meanwhile (its group fails to form or to agree) is a failure during the
        recovery: the coordinator re-forms the group again, and this member follows. Returns
        whether state had to be copied from a replica; a worker asked to stop meanwhile (or
        before) rejoins nothing (``StopRequested``)."""
        started = time.time()
        for attempt in range(4):
            if self.stop_requested:
                raise StopRequested("asked to stop: no group to rejoin is awaited")
            assert self.store is not None
            self.groups.leave()  # outside the except block: see StepLoop.micro_batches
            self.progress.at(self.step + 1, Phase.REJOIN)
            self.faults.rejoining()
            wait = self.membership_timeout
            self._adopt(self.store.next_membership(self.generation, wait, lambda: self.stop_requested))
            try:
                self._join()
                copied = self._agree(model, optimizer, reformed=True)
                break
            except ReplicasDiverged:
                raise
            except Exception as exc:
                self.recoverable(exc, last=attempt == 3)
        else:  # the last attempt failed, and recoverable did not raise: the worker is stopping
            raise StopRequested("asked to stop while the group re-formed")
        self.trace("rejoined", seconds=time.time() - started, world=self.world_size, copied=copied)
        return copied

    def maybe_checkpoint(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, final: bool = False
    ) -> None:
        """Save if a checkpoint is due (``saving.py``): every ``checkpoint_every`` steps, and the
        ``final`` state at the task's end (which waits, up to ``storage_wait_s``, for storage
        that refuses it)."""
        if self.saving.due(final):
            self.saving.save(TrainState(model, optimizer, self.extras), final)

    def _finish(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, export: Path | None) -> str:
        """Save the final state (and rank 0 the exported model, if asked) and report the
        parameters' digest; returns it. The digest does not depend on sharding (``rowdigest.py``):
        a sharded run and an unsharded one that reach the same parameters report the same
        digest, and no rank gathers the model to compute it. Every collective comes before the
        export is written: a replica's other ranks never wait on rank 0's disk."""
        self.maybe_checkpoint(model, optimizer, final=True)
        gathered = None  # a sharded model, whole, for the export (rank 0's replica gathers it)
        if export is not None and exporting.gathers(self.rank, self.step, self.iterations, self.replica_size):
            gathered = exporting.whole(model)
        gather = None
        if sharded.is_sharded(model):
            from unicron.train.shardedcheckpoint import gather_over_replica  # as in _load_checkpoint

            gather = gather_over_replica
        value = layout_digest(model.state_dict(), gather)
        if export is not None and exporting.due(self.rank, self.step, self.iterations):
            # Before the done report: the coordinator ends the task on rank 0's.
            self.saving.fenced(lambda: exporting.export(model, export, self.fence.confirm, gathered))
        self.channel.send(DoneReport(**self.identity(), step=self.step, digest=value))
        self.faults.exiting()
        return value

    # ------------------------------------------------------------------ failures
    def forward_exception(self, exc: BaseException) -> None:
        """Send ``exc`` to the coordinator, classified (the ``with`` block does it on the way out)."""
        self.trace("exception", error=type(exc).__name__)
        self.channel.send(exception_report(exc, self.task, self.generation, self.rank, self.step))

    def identity(self) -> dict[str, Any]:
        return {"task": self.task, "generation": self.generation, "rank": self.rank}

    def _fault_report(self, report: FaultReport) -> None:
        self.trace("fault", action=report.action, step=report.step)
        self.channel.send(report)

    def close(self) -> None:
        """Leave the process group and close the reports (``with init() as session`` does it)."""
        self.saving.abandon(self.timeout.total_seconds())
        self.groups.close()
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


def in_memory_tier(contract: WorkerEnv, persistent: Path | None, node: str) -> Path | None:
    """The in-memory tier: a copy in the node's RAM (tmpfs), read back far faster than the
    persistent checkpoint when a process restarts on the same node; None where there is none."""
    if persistent is None or not contract.host_checkpoints:
        return None
    return checkpoint.host_dir(persistent, node, contract.host_checkpoint_root)


def init(**kwargs: Any) -> Session:
    """The session for this worker, from the environment its agent gave it."""
    return Session(**kwargs)

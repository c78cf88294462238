"""Fault injection as a library: faults by task, rank, step and generation, inside real workers.

Faults come from the task's spec (``run.faults``), handed to workers in ``UNICRON_FAULTS``:

- ``kill``: the worker SIGKILLs itself (a process dies);
- ``hang``: the worker SIGSTOPs itself (a hung process: its peers block in the next collective);
- ``stall``: the worker sleeps ``seconds`` just before its last micro-batch, while its peers are
  already waiting inside the gradient all-reduce (a stall inside a collective);
- ``spin``: loop in Python for ``seconds`` at the same point (an endless loop in the forward
  pass: the process runs, so only its progress tells it apart from its waiting peers);
- ``stall_before_reduce``: sleep ``seconds`` before entering the gradient all-reduce (a rank
  stuck before a collective): inside the last backward pass, before its first gradient bucket
  is launched, when the reduction overlaps backward (its peers' buckets are in flight), else
  after its micro-batches;
- ``raise``: raise ``error(message)``, e.g. a CUDA-like error, through the training loop;
- ``slow``: sleep ``seconds`` at every step from ``step`` on (a straggler);
- ``break``: tear this rank's process group down under its peers (a broken connection; every
  rank's next collective fails, nobody dies);
- ``lose_node``: SIGKILL the worker's agent (its workers die with it): the node is lost;
- ``kill_after_reduce``: SIGKILL itself after the gradient all-reduce, before the update;
- ``kill_in_backward``: SIGKILL itself at the same point as ``stall_before_reduce``: with its
  peers' gradient buckets in flight;
- ``corrupt_transfer``: the first state this rank receives from a live replica arrives damaged
  (one parameter changed after the transfer): the digest check must reject it;
- ``stall_rejoin``: sleep ``seconds`` on the way into the next rebuilt group (at the first
  in-process recovery, whatever the step): a survivor stuck in the recovery itself;
- ``kill_in_agree``: SIGKILL itself as a re-formed group (after a recovery in place, or with
  newcomers) starts agreeing on its state: a member lost during a recovery;
- ``kill_in_transfer``: SIGKILL itself as a re-formed group starts sending its state to the
  members behind (newcomers): a member lost while state is in flight;
- ``corrupt_checkpoint``: overwrite the newest checkpoint, in the persistent folder and in this
  node's in-memory folder, with garbage (a torn or damaged file); the worker goes on.
- ``slow_save``: sleep ``seconds`` inside the checkpoint save at the end of ``step`` (on a rank
  that saves), its position saying it saves: slow storage, which is not a hang.
- ``late_stop``: take a request to stop (SIGTERM) ``seconds`` late, whatever the step: its peers
  stop at a step boundary this rank has already passed (a signal delivered late, an agent slow
  to pass the order on).
- ``hang_at_exit``: once the final state is saved and reported, sleep ``seconds`` on the way
  out, whatever the step (a teardown that does not return: a process group destroyed under a
  dead peer, an exit hook that blocks).
- ``nan_grad``: a NaN in this rank's gradients on the way into the gradient sum of ``step``, in
  the first ``times`` computations of the step on this rank (1: a passing fault; 2 or more: a
  device that computes wrong whatever its samples). ``train/numerics.py`` must catch it.
- ``spike_grad``: as ``nan_grad``, but this rank's gradient is multiplied by ``factor`` (finite:
  a flipped exponent bit multiplies a value by a power of two), a spike in the sum's norm
  (``train/spikes.py``) once the step has enough steps before it to judge.
- ``flip_grad``: as ``nan_grad``, but bit ``bit`` of the first value of this rank's gradient is
  flipped (a bit flipped in its memory or on its way: an exponent's high bit makes the value
  huge or infinite, a low one a change no norm sees);
- ``nan_loss``, ``spike_loss``: as ``nan_grad`` and ``spike_grad``, but in this rank's sum of
  the step's checked metrics (``session.metric(name, checked=True)``, the loss: its value a NaN,
  or multiplied by ``factor``), its gradients untouched (a loss computed wrong where the backward
  never reads it). A program that declares no checked metric is told so, and the fault refused.
- ``nan_sample``: a NaN in the gradients of whichever rank computes sample ``sample`` in
  ``step``, every time (data that gives NaN: a bad sample); ``rank`` and ``generation`` unused.
- ``flip_param``: after the optimizer's update of ``step``, flip bit ``bit`` of this rank's first
  parameter's first value (a bit flipped in its memory, or an update its device computed wrong):
  ``train/replicacheck.py`` must find the odd replica before anything computed from it is
  applied (in the next step's sum, or before a checkpoint of this step).

A fault names a rank, a step and a generation; generation 0 means whichever worker of that rank
first reaches the step, or a later one, in any generation (the rank may not exist at that step
while its task runs shrunk), claimed once through the task's store (asked again at the next
step where the store did not answer).

Each injection first sends a FaultReport with the time, so detection latency can be measured.
"""

from __future__ import annotations

import builtins
import math
import os
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from unicron.core.livespecs import FaultSpec
from unicron.core.protocol import FaultReport

if TYPE_CHECKING:
    import torch

    from unicron.train.metric import Metric

# Injected at an event, not a step:
AT_EVENTS = frozenset(
    {"corrupt_transfer", "stall_rejoin", "kill_in_agree", "kill_in_transfer", "late_stop", "hang_at_exit"}
)
# On the way into each gradient sum of the step (``poison``):
IN_SUM = frozenset({"nan_grad", "spike_grad", "flip_grad", "nan_loss", "spike_loss"})
IN_METRICS = frozenset({"nan_loss", "spike_loss"})  # in the checked metrics' sums, not the gradients'
AT_REDUCE = frozenset({"stall_before_reduce", "kill_in_backward"})  # on the way into the all-reduce
NO_CHECKED_METRIC = (
    "the fault {action} at step {step} strikes the step's checked metrics, and the program declares "
    "none: declare its loss with session.metric('loss', checked=True), or inject nan_grad or "
    "spike_grad instead"
)
# Injected further into the step they are due at than its start:
LATER_IN_STEP = frozenset({"stall", "spin", "kill_after_reduce", "slow_save", "flip_param"})


class FaultInjector:
    def __init__(
        self,
        faults: list[FaultSpec],
        rank: int,
        generation: int,
        report: Callable[[FaultReport], None],
        task: str,
        agent_pid: int | None = None,
    ) -> None:
        self.all_faults = list(faults)
        self.agent_pid = agent_pid  # (None: no agent's pid was given; its parent, then)
        self.faults = [f for f in faults if f.rank == rank and f.generation == generation]
        self.rank, self.generation, self.task = rank, generation, task
        self.report = report
        self.slow_s = 0.0
        self._pending: list[FaultSpec] = []
        self._settled: set[int] = set()  # generation-0 faults already claimed (by anyone)
        self._struck: dict[int, int] = {}  # a nan fault's index -> the computations it struck

    def announce(self, fault: FaultSpec, step: int) -> None:
        """Report ``fault`` as it strikes, at ``step`` (0: at an event)."""
        self.report(
            FaultReport(
                task=self.task,
                generation=self.generation,
                rank=self.rank,
                step=step,
                action=fault.action,
                time=time.time(),
                index=next(i for i, f in enumerate(self.all_faults) if f is fault),
            )
        )

    # For generation-0 faults: True for the first claimant, None where the store did not answer
    # (the coordinator that serves it is away: asked again at the next step, else a fault due
    # while it was down would never strike in this generation)
    claim: Callable[[int], bool | None] | None = None

    def _due(self, step: int) -> list[FaultSpec]:
        at_steps = [
            (i, f)
            for i, f in enumerate(self.all_faults)
            if f.action not in AT_EVENTS and f.action != "nan_sample"
        ]
        due = [f for _, f in at_steps if f in self.faults and f.step == step]
        for index, fault in at_steps:
            first = fault.generation == 0 and fault.step <= step and fault.rank == self.rank
            if first and index not in self._settled and self.claim is not None:
                won = self.claim(index)
                if won is not None:
                    self._settled.add(index)  # claimed now, by this worker or an earlier one
                if won:
                    due.append(fault)
        return due

    def step_started(self, step: int) -> None:
        self._pending = self._due(step)
        for fault in self._pending:
            if fault.action in AT_REDUCE or fault.action in LATER_IN_STEP or fault.action in IN_SUM:
                continue
            self.announce(fault, step)
            if fault.action == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            elif fault.action == "hang":
                os.kill(os.getpid(), signal.SIGSTOP)
            elif fault.action == "raise":
                error = getattr(builtins, fault.error, None)
                kind = error if isinstance(error, type) and issubclass(error, BaseException) else RuntimeError
                raise kind(fault.message)
            elif fault.action == "slow":
                self.slow_s = fault.seconds
            elif fault.action == "break":
                import torch.distributed as dist

                # Close this rank's connections under its peers; its own next collective fails
                # too. Nobody dies: the task can reattempt in place.
                if dist.is_initialized():
                    dist.destroy_process_group()
            elif fault.action == "corrupt_checkpoint":
                self._corrupt_newest_checkpoints()
            elif fault.action == "lose_node":
                os.kill(self.agent_pid or os.getppid(), signal.SIGKILL)
                time.sleep(60)  # the parent-death signals end us
        if self.slow_s:
            time.sleep(self.slow_s)

    folders: tuple[Path | None, ...] = ()  # for corrupt_checkpoint: where checkpoints are kept

    def _corrupt_newest_checkpoints(self) -> None:
        for folder in self.folders:
            newest = max(folder.glob("step-*.pt"), default=None) if folder is not None else None
            if newest is not None:
                data = bytearray(newest.read_bytes())
                data[len(data) // 2 :] = bytes(len(data) - len(data) // 2)  # zero the back half
                newest.write_bytes(bytes(data))

    def transfer_damaged(self) -> bool:
        """Whether the state this rank just received is to be damaged (``corrupt_transfer``)."""
        return self._at_event("corrupt_transfer") is not None

    def rejoining(self) -> None:
        """On the way into a rebuilt group: ``stall_rejoin`` sleeps here."""
        fault = self._at_event("stall_rejoin")
        if fault is not None:
            time.sleep(fault.seconds)

    def agreeing(self) -> None:
        """A re-formed group's members start agreeing on their state: ``kill_in_agree``."""
        if self._at_event("kill_in_agree") is not None:
            os.kill(os.getpid(), signal.SIGKILL)

    def exiting(self) -> None:
        """The final state is saved and reported: ``hang_at_exit`` sleeps here."""
        fault = self._at_event("hang_at_exit")
        if fault is not None:
            time.sleep(fault.seconds)

    def transferring(self) -> None:
        """State is about to be sent to the members behind: ``kill_in_transfer``."""
        if self._at_event("kill_in_transfer") is not None:
            os.kill(os.getpid(), signal.SIGKILL)

    def _at_event(self, action: str) -> FaultSpec | None:
        """A fault injected at an event rather than a step, once; generation 0: the first worker
        of the rank to meet the event, claimed once through the task's store (asked again at the
        event's next turn where the store did not answer)."""
        for index, fault in enumerate(self.all_faults):
            mine = fault.action == action and fault.rank == self.rank
            if not mine or index in self._settled or fault.generation not in (0, self.generation):
                continue
            won: bool | None = fault.generation == self.generation
            if not won and self.claim is not None:
                won = self.claim(index)
            if won is None:
                continue  # the store did not answer: asked again at the event's next turn
            self._settled.add(index)
            if won:
                self.announce(fault, 0)
                return fault
        return None

    def late_stop(self) -> FaultSpec | None:
        """``late_stop`` for this rank and generation (0: any), once; a look-up only, safe in a
        signal handler: the caller reports it (``announce``) when it takes the stop."""
        for index, fault in enumerate(self.all_faults):
            mine = fault.action == "late_stop" and fault.rank == self.rank
            if mine and index not in self._settled and fault.generation in (0, self.generation):
                self._settled.add(index)
                return fault
        return None

    def after_reduce(self, step: int) -> None:
        """Between the gradient all-reduce and the optimizer step: a death the peers only see at
        the next step's all-reduce."""
        for fault in self._pending:
            if fault.action == "kill_after_reduce":
                self.announce(fault, step)
                os.kill(os.getpid(), signal.SIGKILL)

    def before_last_micro_batch(self, step: int) -> None:
        for fault in self._pending:
            if fault.action == "stall":
                self.announce(fault, step)
                time.sleep(fault.seconds)
            elif fault.action == "spin":
                self.announce(fault, step)
                _spin(fault.seconds)

    def saving(self, step: int) -> None:
        """Inside the checkpoint save at the end of ``step``, its position already saying so."""
        for fault in [f for f in self._pending if f.action == "slow_save"]:
            self._pending.remove(fault)
            self.announce(fault, step)
            time.sleep(fault.seconds)

    def poison(
        self, step: int, computed: Sequence[int], params: Sequence[torch.Tensor], checked: Sequence[Metric]
    ) -> None:
        """On the way into a gradient sum of ``step`` (after this rank's micro-batches, or in the
        last backward before its first bucket is sent), having computed the samples ``computed``:
        ``nan_grad`` and ``nan_sample`` put a NaN into a gradient of the first bucket sent,
        ``spike_grad`` multiplies that gradient by its factor, ``flip_grad`` flips a bit of its
        first value; ``nan_loss`` and ``spike_loss`` do the same to the sums of the ``checked``
        metrics."""
        due = [f for f in self._pending if f.action in IN_SUM]
        due += [
            f for f in self.all_faults if f.action == "nan_sample" and f.step == step and f.sample in computed
        ]
        # The last parameter's gradient: in the first bucket sent (``gradsync.Buckets``).
        grad = next((p.grad for p in reversed(params) if p.grad is not None), None)
        for fault in due:
            if fault.action in IN_METRICS and not checked:
                raise RuntimeError(NO_CHECKED_METRIC.format(action=fault.action, step=step))
            if grad is None and fault.action not in IN_METRICS:
                continue  # nothing computed to put it in
            index = self.all_faults.index(fault)
            struck = self._struck.get(index, 0)
            if fault.action in IN_SUM and struck >= fault.times:
                continue
            if struck == 0:
                self.announce(fault, step)
            self._struck[index] = struck + 1
            if fault.action in IN_METRICS:
                for metric in checked:
                    metric.total = metric.total * (fault.factor if fault.action == "spike_loss" else math.nan)
            else:
                assert grad is not None  # (passed over above)
                _strike_gradient(grad, fault)

    def updated(self, step: int, params: Sequence[torch.Tensor]) -> None:
        """After the optimizer's update of ``step`` (the user's ``optimizer.step()`` returned):
        ``flip_param`` flips one bit of the first parameter's first value."""
        for fault in [f for f in self._pending if f.action == "flip_param"]:
            self._pending.remove(fault)
            self.announce(fault, step)
            flip_bit(params[0].detach().reshape(-1)[:1], fault.bit)  # (a view: the parameter's own storage)

    def before_reduce(self, step: int) -> None:
        """On the way into the gradient all-reduce, once per step: in the last backward before
        the first bucket is launched (overlapped), or after the micro-batches."""
        for fault in [f for f in self._pending if f.action in AT_REDUCE]:
            self._pending.remove(fault)
            self.announce(fault, step)
            if fault.action == "kill_in_backward":
                os.kill(os.getpid(), signal.SIGKILL)
            else:
                time.sleep(fault.seconds)


def _strike_gradient(grad: torch.Tensor, fault: FaultSpec) -> None:
    """``fault`` (in the sum, on the gradients) done to ``grad``."""
    if fault.action == "spike_grad":
        grad.mul_(fault.factor)
    elif fault.action == "flip_grad":
        flip_bit(grad.reshape(-1)[:1], fault.bit)
    else:
        grad.view(-1)[0] = float("nan")


def flip_bit(value: torch.Tensor, bit: int) -> None:
    """Flip bit ``bit`` (from the lowest; modulo the width) of the one-element view ``value``, in
    place: the tensor it views changes."""
    import torch  # (imported where it is used: this module is the agent's too)

    same_width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    bits = value.view(same_width[value.element_size()])
    width = 8 * value.element_size()
    bit %= width
    # The mask as the signed integer of the same width (the top bit is negative).
    mask = (1 << bit) - (1 << width if bit == width - 1 else 0)
    bits.bitwise_xor_(mask)


def _spin(seconds: float) -> None:
    """Busy in Python code: the interpreter runs, nothing progresses."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass

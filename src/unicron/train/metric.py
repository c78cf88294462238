"""A value averaged over a step's global batch (the loss, most often), the same on every worker
whatever their number: what a loop prints in place of one worker's last micro-batch's loss.

A worker's last micro-batch is a different set of samples at every world size (and after a
failure, when survivors compute a departed worker's samples), so the loss a loop computed last
is not the step's, and printing it as if it were shows numbers that change with the world size.
DDP scripts all-reduce it by hand; under the session a collective of the script's own would
wait forever on a worker that failed. So the session reduces it with the gradients:

    losses = session.metric("loss")          # before session.steps, on every worker
    for step in session.steps(model, optimizer):
        for batch in loader:
            loss = loss_fn(model, batch)
            loss.backward()
            losses.add(loss)                  # the micro-batch's mean
        ...
        print(step, losses.value)             # the step's mean over its global batch

``session.metric("loss", checked=True)`` also tests the value before the step is applied: not
finite, or a spike against its recent values, and the step goes through the numerical rung as a
wrong gradient sum does (``sumtest.py``).

Each micro-batch's value counts by its number of samples, and the sum over the workers is
divided by the step's samples, as the gradients are weighted: so ``value`` is the mean over the
step's samples of what each sample contributed, at any world size and after any recovery (the
samples a survivor already held count once, what it computes again for a departed worker is
added). The sums travel in one small all-reduce launched beside the gradients' and waited with
them (nothing when no metric is declared), so that the value and the gradients are the same
step's or neither is written. A step with nothing to apply (its state copied from a replica
that had completed it, or abandoned) has no value: NaN.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from unicron.train.porting import DOC, PortingError

if TYPE_CHECKING:
    from unicron.train.loopguard import LoopGuard

ADD_OUTSIDE = (
    "{name}.add(...) outside `for batch in loader:`: add each micro-batch's value inside the "
    f"loop, where the session knows how many samples it stands for. See {DOC}."
)
ADD_TWICE = (
    "{name}.add(...) twice for one micro-batch: add its value once (declare another "
    f"session.metric(...) for another quantity). See {DOC}."
)
READ_EARLY = (
    "{name}.value read inside `for batch in loader:`: the step's value is known once the loop "
    f"ends (it is reduced over the workers with the gradients). See {DOC}."
)


class Metric:
    """What ``session.metric(name)`` returns: ``add`` each micro-batch's value inside the
    loop, read ``value`` after it (see the module)."""

    def __init__(self, name: str, checked: bool = False) -> None:
        self.name = name
        # Its value tested with the step's gradient sum (``sumtest.py``): not finite, or a spike,
        # and the step is not applied (the numerical rung runs, as for the gradients).
        self.checked = checked
        self.guard: LoopGuard | None = None  # the running loop's, while there is one
        self.total: torch.Tensor | float = 0.0  # this worker's sum of value x samples, this step
        self.added_in = -1  # the micro-batch last added
        # The last step's sums over the workers, this metric's index in them, the step's samples:
        # read (a device sync on a GPU) only when ``value`` is.
        self.step: tuple[torch.Tensor, int, int] | None = None

    def add(self, value: torch.Tensor | float) -> None:
        """Add a micro-batch's value (its mean over the micro-batch's samples, as a loss is); a
        tensor stays where it is (no device sync)."""
        guard = self.guard
        if guard is None or not guard.handing_out:
            raise PortingError(ADD_OUTSIDE.format(name=self.name))
        if self.added_in == guard.micro:
            raise PortingError(ADD_TWICE.format(name=self.name))
        self.added_in = guard.micro
        if isinstance(value, torch.Tensor):
            value = value.detach().to(torch.float64).reshape(())
        self.total = self.total + value * guard.samples

    @property
    def value(self) -> float:
        """The last completed step's mean over its global batch, the same on every worker (NaN
        before the first, and for a step with nothing to apply)."""
        if self.guard is not None and self.guard.handing_out:
            raise PortingError(READ_EARLY.format(name=self.name))
        if self.step is None:
            return math.nan
        summed, index, samples = self.step
        return float(summed[index]) / samples

    # ------------------------------------------------------------------ the step loop's side
    def begin(self, guard: LoopGuard) -> None:
        """A step's micro-batches begin: nothing added yet."""
        self.guard, self.total, self.added_in, self.step = guard, 0.0, -1, None

    def void(self) -> None:
        """What this worker added is void (recovery copied state that does not hold it)."""
        self.total, self.added_in = 0.0, -1

    def own_total(self) -> float:
        """This worker's sum of value x samples in the step (a device sync on a GPU)."""
        return float(self.total)

    def sum_here(self, device: torch.device) -> torch.Tensor:
        return torch.as_tensor(self.total, dtype=torch.float64).to(device).reshape(1)


def sums(metrics: list[Metric], device: torch.device) -> torch.Tensor | None:
    """This worker's sums of ``metrics``, as one tensor to reduce (None: no metric declared)."""
    if not metrics:
        return None
    return torch.cat([m.sum_here(device) for m in metrics])


def reduced(metrics: list[Metric], summed: torch.Tensor | None, samples: int) -> None:
    """Hand each metric its step's value: ``summed`` over the workers, over ``samples``."""
    if summed is None:
        return
    for index, metric in enumerate(metrics):
        metric.step = (summed, index, samples)

"""What the loop under ``session.steps`` must not do, because its result would then depend on
the number of workers or on a failure: refused where it happens, with a ``PortingError`` that
names the fix.

Under DDP each of these lines is harmless or at least the same at every world size. Under the
session a step's micro-batches are dealt over however many workers there are (all of them to
one worker, the departed ones' to the survivors after a failure), their gradients accumulate
until the loader reduces them, weighted once by a micro-batch's share of the step, and the
last micro-batch's gradient buckets are reduced while its backward runs. So, silently:

- ``optimizer.zero_grad()`` (or ``model.zero_grad()``) inside ``for batch in loader:`` drops the
  micro-batches accumulated so far: none where each worker has one micro-batch per step, all
  but the last at one worker or after a shrink;
- gradients not cleared between steps count again in the next one, weighted by a micro-batch's
  share of the step times the number of workers;
- gradients clipped, scaled or cleared by hand inside the loop act on one worker's partial sum,
  made of a number of micro-batches that depends on the world size;
- a second backward for one micro-batch adds to gradients whose buckets its first backward
  already sent: kept at one worker, lost at several;
- a backward outside the loader's loop inside the steps leaves gradients of this worker alone,
  never weighted or reduced as the step's;
- parameters changed inside the loop change once per micro-batch of this worker;
- an LR scheduler stepped by hand: per micro-batch, its learning rate follows the micro-batch
  count; per step but not registered, it is neither checkpointed nor copied to a newcomer and
  is stepped again in a step whose state a replica had already completed;
- parameters of the model updated by another optimizer than the one given to
  ``session.steps``: its state is neither checkpointed nor copied, and it updates in a step that
  must change nothing (``noupdate.py``).

How each is seen, at no cost per step for a loop that does none of them:

- ``zero_grad``: the optimizer's and the model's own are wrapped on the instances for the
  loop's life (an instance attribute wins over any class's method, an optimizer subclass's own
  ``zero_grad`` included). A call while micro-batches are handed out is refused at the line
  that makes it, whatever it would clear (at a world size where each worker has one
  micro-batch per step it clears nothing yet: refusing it there too is what keeps a script
  from training at one size and failing at another); a call between steps notes that the
  gradients were cleared. The other ways are weaker: an optimizer's step hooks run at
  ``optimizer.step()``, after the micro-batches are lost; a wrapper on the class misses a
  subclass's own ``zero_grad`` and acts on every optimizer of the process; and whether the
  accumulated ``.grad`` shrank can only be read from its values, a pass over the gradients per
  micro-batch (with a device sync on a GPU) where the sentinel below needs none.
- Every other change to the gradients, a second backward, a backward outside the loop: one
  parameter, the model's first (the *sentinel*), carries a post-accumulate-grad hook, which runs
  once per backward that reaches it. Autograd accumulates into an existing ``.grad`` in place
  (``grad += new``, which DDP also relies on): the same tensor, its version counter one higher.
  So at each backward the hook checks that it runs inside the loader's loop, once per
  micro-batch, and that ``.grad`` is the tensor it saw at the backward before, one version on;
  after each micro-batch's body the loader checks that ``.grad`` did not move since its
  backward. Zeroing, clipping or scaling every gradient touches the sentinel's too
  (``clip_grad_norm_`` multiplies each gradient, even by 1). A backward with
  ``create_graph=True`` makes a new tensor (grad mode is on in the hook): it is followed.
  The identity and version counter of one tensor say what a scan of the values would, for
  nothing.
- Gradients left from the step before: when the loader starts a step, a ``zero_grad`` seen
  since the last reduction says at once that they were cleared; without one (cleared by hand,
  or the first step) each ``.grad`` must be None or zeros, a scan that only such loops pay.
- Parameters: the sentinel's version counter (moved by any in-place change made under
  ``torch.no_grad()``, as an optimizer makes) must not move while micro-batches are handed out;
  the parameters that the optimizer does not hold (none, in most models) must not move at all
  during a step.
- Schedulers: ``LRScheduler.step`` (and ``ReduceLROnPlateau.step``) is wrapped once, on the
  class; on the optimizer of a running loop it is refused unless the session itself is stepping
  the registered schedulers. A ``ReduceLROnPlateau`` needs the metric it watches, so the session
  cannot step it: registered, it is stepped by the loop after the micro-batches, with a global
  value (``session.metric``).

Not seen: changes made through ``.data`` (they bypass the version counter), changes to other
gradients or parameters than the sentinel's alone, and a scheduler class whose own ``step``
does not call ``LRScheduler.step``. In a sharded (FSDP) model FSDP holds the gradients apart
from ``.grad`` until the step's last micro-batch and reshards the parameters itself, so there
the ``zero_grad``, scheduler and leftover-gradient checks hold, the sentinel's do not.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

from unicron.train.gradsync import local
from unicron.train.porting import DOC, PortingError
from unicron.train.state import Stateful

ZERO_GRAD_IN_LOOP = (
    "{call} inside `for batch in loader:`: it drops the micro-batches this worker accumulated "
    "so far in the step, and how many those are depends on the number of workers (all but the "
    "last at one worker or after a failure shrinks the group, none where each has one), so the "
    "step would train on part of its batch. Call it once per step, after optimizer.step() (or "
    "before `for batch in loader:`): the loader accumulates the micro-batches and needs no "
    f"zero_grad between them. See {DOC}."
)
GRADIENTS_LEFT = (
    "the step's micro-batches begin with gradients left in .grad (from the step before, or "
    "from a backward outside `for batch in loader:`): they would be summed into this step's "
    "gradients, weighted by a share that depends on the number of workers. Call "
    "optimizer.zero_grad() once per step, after optimizer.step() (or before `for batch in "
    f"loader:`). See {DOC}."
)
GRADIENTS_CHANGED = (
    "the gradients changed between backward passes inside `for batch in loader:` (cleared, "
    "clipped or scaled there): inside the loop .grad holds this worker's partial sum of the "
    "step, made of a number of micro-batches that depends on the number of workers. Clip, "
    "unscale or change gradients after the loop ends (the loader ends once they are the step's, "
    f"reduced over the workers), and clear them after optimizer.step(). See {DOC}."
)
BACKWARD_TWICE = (
    "a second backward for one micro-batch: the gradients of a step's last micro-batch are "
    "reduced over the workers while its first backward runs, so what a second one adds would be "
    "kept at one worker and lost at several. Call backward once per micro-batch: sum the losses "
    "first ((loss_a + loss_b).backward()); for smaller pieces, pass a smaller batch_size to "
    f"session.loader. See {DOC}."
)
BACKWARD_OUTSIDE = (
    "a backward inside session.steps(...) but outside `for batch in loader:`: its gradients are "
    "this worker's alone, never weighted or reduced with the step's micro-batches. Compute every "
    "loss that trains the model from the loader's micro-batches, inside the loop (the loader "
    f"gives survivors a departed worker's micro-batches too). See {DOC}."
)
PARAMETERS_IN_LOOP = (
    "the model's parameters changed inside `for batch in loader:`: a change made there is made "
    "once per micro-batch of this worker, a number that depends on the number of workers. Change "
    f"parameters after the loop, after optimizer.step(). See {DOC}."
)
PARAMETERS_OUTSIDE_OPTIMIZER = (
    "{count} parameter(s) of the model that the optimizer given to session.steps does not hold "
    "changed during the step (another optimizer, or an update by hand): their optimizer's state "
    "is neither checkpointed nor copied to newcomers, and they would be updated in a step whose "
    "state a replica already holds. Give session.steps one optimizer that holds every trained "
    "parameter (param groups for different settings), or freeze the others "
    f"(requires_grad=False). See {DOC}."
)
SCHEDULER_UNREGISTERED = (
    "an LR scheduler of the session's optimizer stepped by hand, not registered: it would be "
    "neither checkpointed nor copied to a newcomer, stepped again in a step whose state a replica "
    "already holds, and inside `for batch in loader:` stepped once per micro-batch (a number that "
    "depends on the number of workers). Register it before the steps "
    "(session.register('scheduler', scheduler)) and remove your own scheduler.step() call: the "
    f"session steps it once per completed step. See {DOC}."
)
SCHEDULER_REGISTERED = (
    "the scheduler registered as {name!r} stepped by hand: the session steps registered "
    "schedulers once per completed step (and not in a step whose state a replica already "
    f"holds); remove your own scheduler.step() call. See {DOC}."
)
PLATEAU_IN_LOOP = (
    "the ReduceLROnPlateau registered as {name!r} stepped inside `for batch in loader:`: step it "
    "once per step, after the loop, with a value that is the same on every worker "
    f"(session.metric(...)'s .value). See {DOC}."
)

_GUARDS: dict[int, LoopGuard] = {}  # id(optimizer) -> the guard of the loop running with it


class LoopGuard:
    """The checks of one ``session.steps`` loop (see the module); the step loop tells it where
    the step is: ``step_began``, ``loader_began``, ``handing`` and ``returned`` around each
    micro-batch, ``loader_ended``, ``step_ended``; ``state_replaced`` when recovery loaded
    state or cleared the gradients itself."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        extras: dict[str, Stateful],
        sharded: bool,
    ) -> None:
        self.model, self.optimizer, self.extras = model, optimizer, extras
        self.params = [p for p in model.parameters() if p.requires_grad]
        held = {id(p) for group in optimizer.param_groups for p in group["params"]}
        self.outside = [p for p in self.params if id(p) not in held]
        self.sentinel = self.params[0] if self.params and not sharded else None
        self.handing_out = False  # between the step's first micro-batch and the loader's end
        self.micro = 0  # the micro-batch being handed out (counted over the step)
        self.samples = 0  # its number of samples
        self.zeroed = False  # a zero_grad call since the gradients were last reduced
        self.stepping = False  # the session is stepping the registered schedulers
        self.handles: list[Any] = []
        self.restore: list[Callable[[], None]] = []
        self._forget()
        self.outside_versions = [p._version for p in self.outside]
        if self.sentinel is not None:
            hook = self.sentinel.register_post_accumulate_grad_hook(self._accumulated)  # type: ignore[no-untyped-call]
            self.handles.append(hook)
        self._wrap_zero_grad(optimizer, "optimizer.zero_grad()")
        self._wrap_zero_grad(model, "model.zero_grad()")
        install_scheduler_guard()
        _GUARDS[id(optimizer)] = self

    def close(self) -> None:
        _GUARDS.pop(id(self.optimizer), None)
        for handle in self.handles:
            handle.remove()
        for restore in self.restore:
            restore()
        self.handles, self.restore = [], []

    # ------------------------------------------------------------------ where the step is
    def step_began(self) -> None:
        self._record_outside()

    def loader_began(self) -> None:
        """The loader starts handing out the step's micro-batches."""
        if not self.zeroed and not self._cleared():
            raise PortingError(GRADIENTS_LEFT)
        self.micro = -1
        self._forget()

    def handing(self, samples: int) -> None:
        """A micro-batch of ``samples`` samples is handed to the loop's body."""
        self.handing_out, self.micro, self.samples = True, self.micro + 1, samples

    def returned(self) -> None:
        """The loop's body of the micro-batch handed out last is done."""
        sentinel = self.sentinel
        if sentinel is None:
            return
        if sentinel._version != self.sentinel_version:
            raise PortingError(PARAMETERS_IN_LOOP)
        held = self.held
        if held is not None and (sentinel.grad is not held or held._version != self.held_version):
            raise PortingError(GRADIENTS_CHANGED)

    def loader_ended(self) -> None:
        """The loader ran out: the gradients are the step's (or zeros, with nothing to apply)."""
        self.handing_out, self.zeroed = False, False

    def state_replaced(self) -> None:
        """Recovery loaded state into the model or cleared its gradients itself."""
        self._forget()
        self._record_outside()

    def step_ended(self) -> None:
        """The loop's code after the micro-batches is done (before the session's own changes)."""
        moved = sum(p._version != v for p, v in zip(self.outside, self.outside_versions, strict=True))
        if moved:
            raise PortingError(PARAMETERS_OUTSIDE_OPTIMIZER.format(count=moved))

    @contextlib.contextmanager
    def stepping_schedulers(self) -> Iterator[None]:
        self.stepping = True
        try:
            yield
        finally:
            self.stepping = False

    # ------------------------------------------------------------------ the checks
    def _forget(self) -> None:
        """Start following the sentinel afresh: no backward seen yet."""
        self.held: torch.Tensor | None = None
        self.held_version = 0
        self.fired = -1  # the micro-batch of the backward seen last
        self.sentinel_version = self.sentinel._version if self.sentinel is not None else 0

    def _record_outside(self) -> None:
        self.outside_versions = [p._version for p in self.outside]

    def _accumulated(self, param: torch.Tensor) -> None:
        """The sentinel's post-accumulate-grad hook: once per backward that reaches it."""
        if not self.handing_out:
            raise PortingError(BACKWARD_OUTSIDE)
        if self.fired == self.micro:
            raise PortingError(BACKWARD_TWICE)
        grad = param.grad
        if grad is None:
            return
        # In place, one version on; under create_graph=True (grad mode on) the sum is a new tensor.
        moved = grad is not self.held or grad._version != self.held_version + 1
        if self.held is not None and moved and not torch.is_grad_enabled():
            raise PortingError(GRADIENTS_CHANGED)
        self.held, self.held_version, self.fired = grad, grad._version, self.micro

    def _cleared(self) -> bool:
        """Every gradient is None or zeros (a scan, one device sync per device: only without a
        zero_grad call seen)."""
        nonzero: dict[torch.device, list[torch.Tensor]] = {}
        for p in self.params:
            if p.grad is not None:
                grad = local(p.grad)
                nonzero.setdefault(grad.device, []).append(grad.ne(0).any())
        return not any(bool(torch.stack(flags).any()) for flags in nonzero.values())

    def _wrap_zero_grad(self, owner: Any, call: str) -> None:
        own = owner.__dict__.get("zero_grad")
        owner.__dict__["zero_grad"] = _ZeroGrad(self, owner, call, own)

        def restore() -> None:
            if own is None:
                owner.__dict__.pop("zero_grad", None)
            else:
                owner.__dict__["zero_grad"] = own

        self.restore.append(restore)

    def scheduler_stepped(self, scheduler: Any) -> None:
        if self.stepping:
            return  # the session's own (a registered SequentialLR steps its parts: fine too)
        # Registered itself, or a part of a registered SequentialLR or ChainedScheduler.
        name = next(
            (n for n, obj in self.extras.items() if obj is scheduler or scheduler in _parts(obj)),
            None,
        )
        if name is None:
            raise PortingError(SCHEDULER_UNREGISTERED)
        if isinstance(scheduler, ReduceLROnPlateau):
            if self.handing_out:
                raise PortingError(PLATEAU_IN_LOOP.format(name=name))
            return  # needs its metric: the loop steps it (the session puts it back in no-update steps)
        raise PortingError(SCHEDULER_REGISTERED.format(name=name))


class _ZeroGrad:
    """The guarded ``zero_grad`` of the loop's model or optimizer, in its instance dict for the
    loop's life. A copy of the owner (``copy.deepcopy``, pickling: an EMA model made from the
    model inside the loop) gets its class's own ``zero_grad``, bound to the copy, not this one."""

    def __init__(self, guard: LoopGuard, owner: Any, call: str, own: Callable[..., Any] | None) -> None:
        self.guard, self.owner, self.call, self.own = guard, owner, call, own

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.guard.handing_out:
            raise PortingError(ZERO_GRAD_IN_LOOP.format(call=self.call))
        self.guard.zeroed = True
        zero_grad = self.own if self.own is not None else _plain_zero_grad(self.owner)
        return zero_grad(*args, **kwargs)

    def __reduce__(self) -> tuple[Callable[[Any], Any], tuple[Any]]:
        return _plain_zero_grad, (self.owner,)


def _plain_zero_grad(owner: Any) -> Any:
    return type(owner).zero_grad.__get__(owner)


def _parts(obj: object) -> list[Any]:
    return list(getattr(obj, "_schedulers", []) or [])


def install_scheduler_guard() -> None:
    """Wrap ``LRScheduler.step`` and ``ReduceLROnPlateau.step`` (once per process): a step of a
    scheduler whose optimizer runs in a ``session.steps`` loop goes through its guard."""
    for cls in (LRScheduler, ReduceLROnPlateau):
        step = cls.__dict__["step"]
        if not getattr(step, "_unicron_guard", False):
            cls.step = _guard_step(step)  # type: ignore[method-assign]


def _guard_step(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def step(self: Any, *args: Any, **kwargs: Any) -> Any:
        guard = _GUARDS.get(id(getattr(self, "optimizer", None)))
        if guard is not None and not getattr(self, "_is_initial", False):  # not its constructor's
            guard.scheduler_stepped(self)
        return original(self, *args, **kwargs)

    step._unicron_guard = True  # type: ignore[attr-defined]
    return step

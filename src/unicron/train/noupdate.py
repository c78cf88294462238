"""A step with no update to make: the state already holds it (copied from a replica that
finished it), it was abandoned (the worker is stopping, its peers gone), or its data was at fault
and the task skips it (``numericstep.py``).

The user's code after the micro-batch loop still runs (clipping, ``scaler.unscale_``,
``scaler.step``, ``scaler.update``, ``optimizer.step``). It must change nothing, and it must not
fail. So:

- the gradients are zeros, not None: a ``GradScaler`` asserts that it saw some ("No inf checks
  were recorded for this optimizer");
- ``optimizer.step`` does nothing until the step ends;
- the registered objects are put back as they were (a scaler's ``update()`` moves its growth
  count, and would move its scale);
- so are the model's parameters and buffers and the optimizer's hyper-parameters (``lr``...):
  a loop that changes them after its ``optimizer.step()`` (a decay or a clamp by hand, a
  learning rate set by hand) would otherwise apply that change a second time to a state that a
  replica had already carried through the step, or save it with a step never completed. The
  copy goes to host memory, once per such step: they happen only in recoveries, stops and skips.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from unicron.train.gradsync import local
from unicron.train.state import Stateful


def _no_step(*args: Any, **kwargs: Any) -> None:
    return None


class NoUpdate:
    """Holds the optimizer and the registered objects still until :meth:`release`."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, extras: dict[str, Stateful]):
        for p in model.parameters():
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
        self.optimizer, self.extras = optimizer, extras
        # An LR scheduler wraps the optimizer's step in the instance: put that wrapper back.
        self.own_step = optimizer.__dict__.get("step")
        optimizer.__dict__["step"] = _no_step
        self.saved = {name: copy.deepcopy(obj.state_dict()) for name, obj in extras.items()}
        tensors = [*model.parameters(), *model.buffers()]
        self.tensors = [(t, local(t).detach().to("cpu", copy=True)) for t in tensors]
        self.settings = [
            {k: copy.deepcopy(v) for k, v in g.items() if k != "params"} for g in optimizer.param_groups
        ]

    def release(self) -> None:
        if self.own_step is None:
            del self.optimizer.__dict__["step"]
        else:
            self.optimizer.__dict__["step"] = self.own_step
        for name, obj in self.extras.items():
            obj.load_state_dict(self.saved[name])
        with torch.no_grad():
            for tensor, saved in self.tensors:
                local(tensor).copy_(saved)
        for group, settings in zip(self.optimizer.param_groups, self.settings, strict=True):
            group.update(settings)

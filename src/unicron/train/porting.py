"""Errors that name the fix for what a DDP script ported to the session most often keeps.

The session forms the task's process group itself (from its agent's environment, or from
torchrun's) and reduces the gradients itself, so a port removes ``dist.init_process_group(...)``
and the ``DistributedDataParallel`` wrapper. Left in, they fail with torch's own words, which say
nothing of the fix:

- ``dist.init_process_group(...)`` under torchrun succeeds, and the session's own then fails
  with "trying to initialize the default process group twice"; under a Unicron agent it fails
  at once on the rendezvous variables (``MASTER_ADDR``) that the agent does not set, because the
  task's store is the session's to use;
- ``DistributedDataParallel(model)`` before the session formed its group fails with "Default
  process group has not been initialized".

``Session.start`` refuses a default group that exists before it (``refuse_existing_group``), and
``install`` (run when ``unicron.train`` is imported, before the script reaches either line)
turns the other two into a ``PortingError`` that says what to remove. Neither guard changes what
a call that would work does: ``init_process_group`` is refused only in a worker started by a
Unicron agent and only without a ``store`` (the session always passes its task's store), and
DDP's error is only reworded, for the case in which torch raises it.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from unicron.core.workerenv import KEYS

DOC = "docs/training-library.md, 'Porting a DDP script'"

GROUP_BEFORE_SESSION = (
    "torch.distributed's default process group already exists when the Unicron session starts: "
    "remove dist.init_process_group(...) (and dist.destroy_process_group()) from the script; the "
    "session forms the process group itself, under a Unicron agent and under torchrun alike, and "
    f"forms it again after a failure. See {DOC}."
)
INIT_UNDER_AGENT = (
    "a worker started by a Unicron agent called dist.init_process_group: remove "
    "dist.init_process_group(...) (and dist.destroy_process_group()) from the script; the "
    "session forms the task's process group "
    "from the agent's environment when session.steps(...) begins, and forms it again after a "
    f"failure. See {DOC}."
)
DDP_WITHOUT_GROUP = (
    "DistributedDataParallel(model) with no process group: remove the DistributedDataParallel "
    "wrapper and pass the model itself to session.steps(model, optimizer); the session forms the "
    "process group when its steps begin, reduces the gradients itself and recovers them after a "
    f"failure (DDP's reducer could do neither). See {DOC}."
)


class PortingError(ValueError):
    """A training script set torch.distributed up itself, where the Unicron session does, or its
    loop does what would make its result depend on the number of workers (``loopguard.py``); the
    message says the fix. A ValueError, as torch's own errors for these cases are."""


def refuse_existing_group() -> None:
    """For ``Session.start``: the default group must be the session's to form."""
    if dist.is_available() and dist.is_initialized():
        raise PortingError(GROUP_BEFORE_SESSION)


def install() -> None:
    """Put the two guards in place (once per process)."""
    if not dist.is_available():
        return
    if not getattr(dist.init_process_group, "_unicron_guard", False):
        dist.init_process_group = _guard_init(dist.init_process_group)
    init = DistributedDataParallel.__init__
    if not getattr(init, "_unicron_guard", False):
        DistributedDataParallel.__init__ = _guard_ddp(init)  # type: ignore[method-assign]


def _guard_init(original: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        if KEYS["task"] in os.environ:
            bound = signature.bind_partial(*args, **kwargs)
            if bound.arguments.get("store") is None:
                raise PortingError(INIT_UNDER_AGENT)
        return original(*args, **kwargs)

    init_process_group._unicron_guard = True  # type: ignore[attr-defined]
    return init_process_group


def _guard_ddp(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def __init__(self: DistributedDataParallel, *args: Any, **kwargs: Any) -> None:
        try:
            original(self, *args, **kwargs)
        except (ValueError, RuntimeError) as exc:
            if not dist.is_initialized() and "process group has not been initialized" in str(exc):
                raise PortingError(DDP_WITHOUT_GROUP) from exc
            raise

    __init__._unicron_guard = True  # type: ignore[attr-defined]
    return __init__

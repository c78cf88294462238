"""The training state: the model, the optimizer and every stateful object the user registers
(an LR scheduler, a GradScaler, their own counters), as one unit that is checkpointed,
transferred to newcomers, and checked by one digest.

Registered objects follow PyTorch's convention (``state_dict()`` / ``load_state_dict()``, as
schedulers, scalers and optimizers do) and must be the same on every replica, as the model and
optimizer are: the members compare one digest of all of it to decide who holds the newest state.
State that differs by rank (a per-rank RNG stream) does not belong here.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch
from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

from unicron.train import sharded


@runtime_checkable
class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


class StateMismatch(RuntimeError):
    """A saved or received state does not hold what this program registered."""


@dataclass
class TrainState:
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    extras: dict[str, Stateful] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.model, torch.nn.parallel.DistributedDataParallel):
            raise TypeError(
                "the session got a DistributedDataParallel model: pass the model itself "
                "(DDP(model).module); the session reduces the gradients itself, and recovers them. "
                "See docs/training-library.md, 'Porting a DDP script'"
            )
        own = {id(p) for p in self.model.parameters()}
        foreign = sum(1 for g in self.optimizer.param_groups for p in g["params"] if id(p) not in own)
        if foreign:
            # Their gradients would never be reduced: each rank would update them its own way.
            raise ValueError(
                f"the optimizer updates {foreign} tensor(s) that are not parameters of the model given "
                "to session.steps: create the optimizer from that model's parameters "
                "(torch.optim.AdamW(model.parameters(), ...)) after the model is built and moved"
            )

    @property
    def sharded(self) -> bool:
        """The model is sharded inside its replica (FSDP2): ``sharded.py``."""
        return sharded.is_sharded(self.model)

    def state_dict(self) -> dict[str, Any]:
        """``model``, ``optimizer`` and, when objects are registered, ``extras`` (name -> state).
        A sharded model's tensors are this rank's shards (as the matching rank of another
        replica holds them): what is digested and sent between replicas."""
        parts: dict[str, Any] = {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}
        if self.extras:
            parts["extras"] = {name: obj.state_dict() for name, obj in self.extras.items()}
        return sharded.localized(parts) if self.sharded else parts

    def load_state_dict(self, parts: dict[str, Any], whole: bool = False) -> None:
        """Load every part; the registered names must match the saved ones exactly (a missing
        or unknown one means the state was saved by a different program). ``whole``: the
        tensors are whole (a checkpoint), not this rank's shards (another replica's)."""
        if self.sharded:
            parts = sharded.restored(parts, self.model, self.optimizer, whole)
        saved = dict(parts.get("extras") or {})
        if set(saved) != set(self.extras):
            raise StateMismatch(
                f"the state holds objects {sorted(saved)} but this program registered "
                f"{sorted(self.extras)}: register the same objects (session.register) as the run "
                "that saved it, or start from an empty checkpoint directory"
            )
        self.model.load_state_dict(parts["model"])
        self.optimizer.load_state_dict(parts["optimizer"])
        for name, obj in self.extras.items():
            obj.load_state_dict(saved[name])

    def digest(self) -> str:
        """A checksum of everything that decides the next step: parameters, buffers, the
        optimizer's state and the registered objects'."""
        return digest_parts(self.state_dict())


def check_registrable(name: str, obj: object, registered: dict[str, Stateful]) -> None:
    """Refuse what ``session.register`` cannot keep, saying what to do instead."""
    if isinstance(obj, (torch.nn.Module, torch.optim.Optimizer)):
        raise TypeError(
            f"session.register({name!r}, ...): the model and the optimizer are kept already; "
            "pass them to session.steps(model, optimizer)"
        )
    if not isinstance(obj, Stateful):
        raise TypeError(
            f"session.register({name!r}, ...): a {type(obj).__name__} has no state_dict()/"
            "load_state_dict(); wrap its state in an object that has both"
        )
    if not name.isidentifier() or name in registered:
        raise ValueError(f"session.register: {name!r} must be a new identifier (taken: {sorted(registered)})")


def step_schedulers(registered: dict[str, Stateful], completed: int) -> None:
    """Advance the registered LR schedulers after the optimizer step that follows step
    ``completed``. The session does this, not the user's loop: a step whose state came from a
    replica (which had stepped its scheduler already) must not step it again, and only the
    session knows which steps those are. A ``ReduceLROnPlateau`` needs the value it watches: the
    loop steps it (``loopguard.py``), and the session only keeps and restores its state."""
    for name, obj in registered.items():
        if isinstance(obj, LRScheduler) and not isinstance(obj, ReduceLROnPlateau):
            if obj.last_epoch != completed:
                raise RuntimeError(
                    f"the scheduler registered as {name!r} is at step {obj.last_epoch}, expected "
                    f"{completed}: the session steps registered schedulers; remove your own "
                    "scheduler.step() call"
                )
            obj.step()


def digest_parts(parts: dict[str, Any]) -> str:
    """The digest of a state as ``TrainState.state_dict`` returns it (without extras it is the
    digest of model and optimizer alone, so checkpoints written before extras existed load)."""
    extras = [parts["extras"]] if parts.get("extras") else []
    return digest_of(parts["model"], parts["optimizer"], *extras)


def digest_of(*states: Any) -> str:
    h = hashlib.sha256()
    for state in states:
        _feed(h, state)
    return h.hexdigest()[:16]


def _feed(h: Any, value: Any) -> None:
    """Hash nested dicts, lists and tensors in a fixed order, by type, shape and bytes."""
    if isinstance(value, torch.Tensor):
        flat = value.detach().cpu().contiguous().reshape(-1)
        h.update(f"T{flat.dtype}{tuple(value.shape)}".encode())
        h.update(flat.view(torch.uint8).numpy().tobytes())
    elif isinstance(value, dict):
        h.update(b"{")
        for key in sorted(value, key=str):
            h.update(repr(key).encode())
            _feed(h, value[key])
        h.update(b"}")
    elif isinstance(value, (list, tuple)):
        h.update(b"[")
        for item in value:
            _feed(h, item)
        h.update(b"]")
    else:
        h.update(repr(value).encode())

"""A model sharded with FSDP2 inside its replica: what the session does differently.

- Gradients: FSDP reduce-scatters them inside the replica at the step's last micro-batch only
  (``sync_gradients``, as DDP's ``no_sync``), as sums (``prepare`` sets the divide factor to 1:
  the session weighs samples itself); the session sums each rank's shard over the replicas.
- Weighing a micro-batch: a sharded parameter is not in the autograd graph (FSDP computes with
  an all-gathered copy), so hooks on it never see the gradient; ``weigh_outputs`` scales the
  gradient arriving at the model's outputs instead, which scales every parameter's gradient by
  the chain rule (true of any loss computed from the model's outputs).
- State: digests and transfers between replicas use each rank's own shard (``localized``; a
  replacement replica's rank takes the matching rank's shard); checkpoints are written shard by
  shard and reshard as they load (``shardedcheckpoint.py``); a whole-state checkpoint of an
  unsharded run loads into the shards (``restored``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.utils._pytree import tree_map


def is_sharded(model: torch.nn.Module) -> bool:
    return any(isinstance(p, DTensor) for p in model.parameters())


def sizes(model: torch.nn.Module) -> tuple[int, int]:
    """How many parameter elements this rank holds, and the model's."""
    params = list(model.parameters())
    held = sum(p.to_local().numel() if isinstance(p, DTensor) else p.numel() for p in params)
    return held, sum(p.numel() for p in params)


def fsdp_modules(model: torch.nn.Module) -> list[FSDPModule]:
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def prepare(model: torch.nn.Module) -> None:
    """FSDP sums a replica's gradients instead of averaging them (see the module), with a plain
    SUM: for float32 and bfloat16 it would otherwise pre-multiply in the collective
    (``PREMUL_SUM``), which gloo refuses."""
    for module in fsdp_modules(model):
        module.set_gradient_divide_factor(1.0)
        module.set_force_sum_reduction_for_comms(True)


def sync_gradients(units: list[FSDPModule], on: bool) -> None:
    """Whether the next backward of the model whose FSDP ``units`` these are reduce-scatters
    (the step's last micro-batch) or accumulates."""
    for unit in units:
        unit.set_requires_gradient_sync(on, recurse=False)


class OutputWeight:
    """Scales the gradient at the model's outputs by ``weight`` while it is not 1."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.weight = 1.0
        self.handle = model.register_forward_hook(self._hook)

    def _hook(self, module: torch.nn.Module, args: Any, output: Any) -> Any:
        weight = self.weight
        if weight == 1.0:
            return output

        def scaled(t: Any) -> Any:
            if isinstance(t, torch.Tensor) and t.requires_grad:
                t.register_hook(lambda grad: grad * weight)  # type: ignore[no-untyped-call]
            return t

        return tree_map(scaled, output)

    def close(self) -> None:
        self.handle.remove()


def localized(tree: Any) -> Any:
    """``tree`` with each sharded tensor replaced by this rank's shard."""
    return tree_map(lambda v: v.to_local() if isinstance(v, DTensor) else v, tree)


Rebuild = Callable[[torch.Tensor, DTensor], torch.Tensor]


def _from_shard(value: torch.Tensor, like: DTensor) -> torch.Tensor:
    mesh, placements = like.device_mesh, like.placements
    return DTensor.from_local(value, mesh, placements, shape=like.shape, stride=like.stride())


def _from_whole(value: torch.Tensor, like: DTensor) -> torch.Tensor:
    return distribute_tensor(value, like.device_mesh, like.placements)


def restored(
    parts: dict[str, Any], model: torch.nn.Module, optimizer: torch.optim.Optimizer, whole: bool
) -> dict[str, Any]:
    """``parts`` (model and optimizer state as plain tensors: this rank's shards, or ``whole``
    tensors from a checkpoint) made sharded like the model's own, ready for ``load_state_dict``."""
    rebuild: Rebuild = _from_whole if whole else _from_shard
    current = model.state_dict()
    model_part = {
        k: rebuild(v, current[k]) if isinstance(current.get(k), DTensor) else v
        for k, v in parts["model"].items()
    }
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state: dict[Any, Any] = {}
    for index, values in parts["optimizer"]["state"].items():
        param = params[int(index)]
        state[index] = {
            k: rebuild(v, param) if _like_param(v, param, whole) else v for k, v in values.items()
        }
    return {**parts, "model": model_part, "optimizer": {**parts["optimizer"], "state": state}}


def _like_param(value: Any, param: torch.Tensor, whole: bool) -> bool:
    """An optimizer state tensor sharded as its parameter is (a moment, not the step count)."""
    if not isinstance(param, DTensor) or not isinstance(value, torch.Tensor) or value.dim() == 0:
        return False
    return tuple(value.shape) == (tuple(param.shape) if whole else tuple(param.to_local().shape))

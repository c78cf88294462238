"""Where a worker computes, and the process-group backend that goes with it.

An agent started with ``--gpus`` gives each worker exactly one GPU (``CUDA_VISIBLE_DEVICES``),
so the worker's device is ``cuda:0`` whatever its local rank; where every process sees every
GPU (torchrun, or an agent without ``--gpus``) it takes the one at its local rank, as torchrun's
own recipe does. Without a GPU it is the CPU.

On a GPU the task's groups are formed with ``cpu:gloo,cuda:nccl``: the gradients (CUDA tensors)
are summed by NCCL, while the session's own small collectives (the step and state digest agreed
on, the samples a rank holds, a state transferred as bytes) stay CPU tensors and go over gloo,
so none of them is copied to the GPU and back. torch picks the backend by the tensor's device.
"""

from __future__ import annotations

import torch

GPU_BACKEND = "cpu:gloo,cuda:nccl"


def worker_device(local_rank: int) -> torch.device:
    """This worker's device: its GPU (the only one it sees under an agent with ``--gpus``, the one
    at ``local_rank`` when it sees several), else the CPU."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    count = torch.cuda.device_count()
    return torch.device("cuda", local_rank if count > 1 and local_rank < count else 0)


def backend(device: torch.device) -> str:
    """The process-group backend for workers on ``device``."""
    return GPU_BACKEND if device.type == "cuda" else "gloo"


def uses_nccl(backend_name: str) -> bool:
    """Whether a group formed with ``backend_name`` sums CUDA tensors with NCCL."""
    return "nccl" in backend_name

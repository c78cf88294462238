"""The session's group code on a GPU, in a world of one (one GPU: NCCL refuses two ranks on it).

    python bench/nccl_check.py OUT.json

Forms the task's group the way a worker does (``membership.join`` with ``devices.backend``:
``cpu:gloo,cuda:nccl``), then runs each piece of the library that touches it: a control
collective on CPU tensors (gloo), the gradient sum on CUDA tensors as one flat buffer and in
buckets launched from backward's hooks (NCCL, completion polled), the state agreement, then the
abort of the group (``Peers.abandon``: torch's process-group abort) and a new generation's group
formed after it, summing again. Each check records whether it held and its error, if any; a
failed check does not stop the others. Run by ``bench/gpu_bench.py`` on a GPU machine.
"""

from __future__ import annotations

import json
import sys
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from unicron.control.launch.localcluster import free_port
from unicron.train import devices, membership
from unicron.train.gradsync import Buckets, all_reduce_gradients
from unicron.train.peers import Peers
from unicron.train.state import TrainState

TIMEOUT = timedelta(seconds=60)


def gradients(model: torch.nn.Module, device: torch.device) -> list[torch.Tensor]:
    """One backward on fresh data; the gradients it left (copies)."""
    model.zero_grad(set_to_none=True)
    model(torch.randn(8, 64, device=device, dtype=torch.float64)).square().sum().backward()
    return [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]


def checks(store: Any, device: torch.device) -> dict[str, Callable[[], Any]]:
    state: dict[str, Any] = {}
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64)).to(device, torch.float64)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def join(generation: int) -> str:
        membership.join(store, "nccl-check", generation, 0, 1, TIMEOUT, devices.backend(device))
        state["peers"] = Peers.world()
        return str(state["peers"].backend)

    def flat() -> bool:  # world of one: the sum is the rank's own, times the scale
        local = gradients(model, device)
        all_reduce_gradients(model, state["peers"], lambda: False, scale=0.5)
        return all(torch.equal(p.grad, 0.5 * g) for p, g in zip(model.parameters(), local, strict=True))

    def buckets() -> bool:
        sums = Buckets(model, cap_bytes=64 * 64 * 8)  # several buckets
        sums.arm(state["peers"], 0.5)
        local = gradients(model, device)  # the hooks launch each bucket as it fills
        launched = len(sums.flights)
        sums.finish(lambda: False)
        exact = all(torch.equal(p.grad, 0.5 * g) for p, g in zip(model.parameters(), local, strict=True))
        return exact and launched == len(sums.buckets) > 1

    def agree() -> list[Any]:
        agreed = membership.agree(state["peers"], TrainState(model, optimizer), 7, "gpu-node")
        return [agreed.step, agreed.copied]

    def abort() -> bool:
        state["peers"].abandon()  # torch's process-group abort for an NCCL group
        return not dist.is_initialized()

    return {
        "group_formed": lambda: join(1),
        "control_collective_on_cpu": lambda: state["peers"].maxima([3, 7]) == [3, 7],
        "gradient_sum_flat": flat,
        "gradient_sum_in_buckets": buckets,
        "state_agreement": agree,
        "group_aborted": abort,
        "next_group_formed": lambda: join(2),
        "gradient_sum_after_abort": flat,
    }


def main(out: Path) -> dict[str, Any]:
    result: dict[str, Any] = {"device": None, "checks": {}}
    if not torch.cuda.is_available():
        result["error"] = "no CUDA device"
        out.write_text(json.dumps(result, indent=2))
        return result
    device = devices.worker_device(0)
    torch.cuda.set_device(device)
    result["device"] = torch.cuda.get_device_name(device)
    result["nccl"] = ".".join(str(v) for v in torch.cuda.nccl.version())
    store = dist.TCPStore("127.0.0.1", free_port(), 1, True, timeout=TIMEOUT)
    for name, check in checks(store, device).items():
        try:
            result["checks"][name] = {"ok": True, "value": check()}
        except Exception as exc:
            tail = traceback.format_exc().splitlines()[-6:]
            result["checks"][name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "where": tail}
        out.write_text(json.dumps(result, indent=2))
    result["passed"] = all(c["ok"] and c["value"] is not False for c in result["checks"].values())
    out.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1])), indent=2))

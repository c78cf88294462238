"""Where a Slurm allocation puts Unicron: which node is the head, and every node's address.

``unicron slurm run`` (the batch script's one command) and ``unicron slurm node`` (one per node,
started by ``srun``) both read the allocation the same way, from the variables Slurm sets in
every job step and from ``scontrol`` (the node list expanded, each node's ``NodeAddr``). The
first node of the allocation is the head: it runs the coordinator, and every node runs an agent.
Parsing is kept pure (tested with Slurm's own output as text); ``scontrol`` is called in one place.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from unicron.core.errors import UsageError

NOT_IN_A_JOB = (
    "this runs inside a Slurm allocation (SLURM_JOB_ID and SLURM_JOB_NODELIST are not set): submit "
    "it with `sbatch deploy/slurm/unicron.sbatch TASK.yaml` (or run it under salloc)"
)


class SlurmError(UsageError):
    """Slurm cannot tell us the allocation (no scontrol, or it failed)."""


@dataclass(frozen=True)
class Allocation:
    """A Slurm job's nodes, in Slurm's order, and the node this process runs on."""

    job_id: str
    nodes: tuple[str, ...]
    here: str
    addresses: Mapping[str, str]  # node -> the IP address its daemons and workers use

    @property
    def head(self) -> str:
        return self.nodes[0]

    @property
    def is_head(self) -> bool:
        return self.here == self.head

    def address(self, node: str) -> str:
        return self.addresses[node]


CPU_SLOTS = 1  # a node whose share of the job has no GPU: one worker slot (a CPU worker)
_GPU_ID = re.compile(r"[0-9]+|(GPU|MIG)-[0-9A-Za-z/._-]+")  # an index, or a GPU's or MIG's UUID


@dataclass(frozen=True)
class Slots:
    """A node's worker slots in a job, the GPU ids that go with them (its agent's ``--gpus``; empty
    when the ids are not known), and where the number came from (said by the job)."""

    def __str__(self) -> str:
        gpus = f", GPUs {','.join(self.gpus)}" if self.gpus else ""
        return f"{self.count} worker slot{'s' if self.count != 1 else ''}{gpus}, from {self.source}"

    count: int
    gpus: tuple[str, ...]
    source: str


def _gpu_list(value: str | None) -> list[str]:
    """``0,1,3`` (or UUIDs) -> the ids; [] for anything else (unset, ``NoDevFiles``, ``-1``)."""
    ids = [word.strip() for word in (value or "").split(",")]
    return ids if ids and all(_GPU_ID.fullmatch(i) for i in ids) else []


def node_slots(env: Mapping[str, str], given: int = 0) -> Slots:
    """This node's worker slots, read where its agent runs (the ``srun`` step of ``unicron slurm
    node``): ``given`` (``--slots``) when above 0; else the GPUs Slurm gave the step on this node:
    ``SLURM_GPUS_ON_NODE``, else the ids in ``SLURM_STEP_GPUS`` or ``CUDA_VISIBLE_DEVICES``; else
    :data:`CPU_SLOTS`, a CPU worker, as on a test cluster without GPUs. ``SLURM_JOB_GPUS`` is not
    read: in a step it is the batch node's, passed on to every node, and it lists the GPUs an
    ``--exclusive`` job holds without having asked for them, which its steps do not get. The GPU
    ids are ``CUDA_VISIBLE_DEVICES``'s (numbered as the node's processes see them) when it names
    as many GPUs as there are slots; each worker then gets one of them."""
    visible = _gpu_list(env.get("CUDA_VISIBLE_DEVICES"))

    def slots(count: int, source: str) -> Slots:
        return Slots(count, tuple(visible) if len(visible) == count else (), source)

    if given > 0:
        return slots(given, f"--slots {given}")
    on_node = env.get("SLURM_GPUS_ON_NODE", "").strip()
    if on_node.isdigit() and int(on_node) > 0:
        return slots(int(on_node), f"SLURM_GPUS_ON_NODE={on_node}")
    for name in ("SLURM_STEP_GPUS", "CUDA_VISIBLE_DEVICES"):
        if ids := _gpu_list(env.get(name)):
            return slots(len(ids), f"{name}={env[name]}")
    return Slots(
        CPU_SLOTS,
        (),
        "the default for a node with no GPU in the job, a CPU worker (SLURM_GPUS_ON_NODE unset: ask "
        "for GPUs with `sbatch --gpus-per-node=N`, or set --slots N)",
    )


def parse_node_addresses(text: str) -> dict[str, str]:
    """``scontrol show node -o`` (one node per line, ``Key=Value`` words) -> NodeName: NodeAddr."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        fields = dict(word.split("=", 1) for word in line.split() if "=" in word)
        if "NodeName" in fields:
            found[fields["NodeName"]] = fields.get("NodeAddr") or fields["NodeName"]
    return found


def allocation_from(
    env: Mapping[str, str],
    expand: Callable[[str], list[str]],
    addresses_of: Callable[[list[str]], dict[str, str]],
    resolve: Callable[[str], str],
) -> Allocation:
    """The allocation from a job step's environment; ``expand`` turns a node list such as
    ``n[1-3]`` into names, ``addresses_of`` gives each node's ``NodeAddr``, and ``resolve`` turns
    a host name into an address (on a cluster NodeAddr is often a name)."""
    job, node_list = env.get("SLURM_JOB_ID"), env.get("SLURM_JOB_NODELIST")
    if not job or not node_list:
        raise UsageError(NOT_IN_A_JOB)
    nodes = expand(node_list)
    if not nodes:
        raise SlurmError(f"SLURM_JOB_NODELIST={node_list!r} names no node")
    here = env.get("SLURMD_NODENAME") or socket.gethostname()
    if here not in nodes:
        raise SlurmError(
            f"this node ({here}, from SLURMD_NODENAME) is not in the job's nodes {nodes}: run it "
            "inside the job's own steps (srun) or its batch script"
        )
    named = addresses_of(nodes)
    missing = [n for n in nodes if n not in named]
    if missing:
        raise SlurmError(f"scontrol gave no address for {missing}: check `scontrol show node {missing[0]}`")
    return Allocation(job, tuple(nodes), here, {n: resolve(named[n]) for n in nodes})


def scontrol(*args: str) -> str:
    """Run ``scontrol`` (the one place this module calls Slurm); a clear error when it fails."""
    if shutil.which("scontrol") is None:
        raise SlurmError("scontrol is not on PATH: run this on a Slurm node (or install slurm-client)")
    done = subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise SlurmError(f"scontrol {' '.join(args)} failed: {done.stderr.strip() or done.returncode}")
    return done.stdout


def ip_of(name: str) -> str:
    """``name``'s IPv4 address (itself when it already is one)."""
    try:
        return str(socket.getaddrinfo(name, None, socket.AF_INET)[0][4][0])
    except OSError as exc:
        raise SlurmError(
            f"cannot resolve the node address {name!r} ({exc}): set NodeAddr in slurm.conf"
        ) from None


def current_allocation() -> Allocation:
    """The allocation this process runs in, asking Slurm."""
    return allocation_from(
        os.environ,
        lambda nodes: scontrol("show", "hostnames", nodes).split(),
        lambda nodes: parse_node_addresses(scontrol("show", "node", "-o", ",".join(nodes))),
        ip_of,
    )

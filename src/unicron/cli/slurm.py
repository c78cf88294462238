"""``unicron slurm run`` and ``unicron slurm node``: options checked here, the work in
``unicron.control.launch.slurmjob``."""

from __future__ import annotations

import os
from pathlib import Path

from unicron.control.launch.slurm import current_allocation
from unicron.control.launch.slurmjob import Layout, run_job, run_node
from unicron.core.errors import UsageError
from unicron.core.livespecs import parse_live_tasks


def default_slots() -> int:
    """The node's GPUs as Slurm gave them to the job, else 1."""
    gpus = os.environ.get("SLURM_GPUS_ON_NODE", "")
    return int(gpus) if gpus.isdigit() and int(gpus) > 0 else 1


def _coordinator_args(settings: Path | None, cluster: Path | None) -> list[str]:
    args: list[str] = []
    for flag, path in (("--settings", settings), ("--cluster", cluster)):
        if path is not None:
            if not path.is_file():
                raise UsageError(f"{flag} {path} does not exist: pass a YAML file on the shared storage")
            args += [flag, str(path.resolve())]
    return args


def run(
    specs: list[Path], root: Path | None, port: int, slots: int, settings: Path | None,
    cluster: Path | None, wait_s: float,
) -> int:  # fmt: skip
    for spec in specs:
        if not spec.is_file():
            raise UsageError(f"task file {spec} does not exist: pass the YAML of the tasks to run")
        parse_live_tasks(spec.read_text(), str(spec))  # a bad spec is refused before anything starts
    if slots < 0:
        raise UsageError(f"--slots {slots}: pass a positive number of worker slots per node (or 0: the GPUs)")
    allocation = current_allocation()
    folder = (root or Path(f".unicron/slurm-{allocation.job_id}")).resolve()
    passed = _coordinator_args(settings, cluster)
    return run_job(allocation, Layout(folder, port), specs, slots or default_slots(), passed, wait_s)


def node(root: Path, port: int, slots: int, settings: Path | None, cluster: Path | None) -> int:
    allocation = current_allocation()
    layout = Layout(root.resolve(), port)
    return run_node(allocation, layout, slots or default_slots(), _coordinator_args(settings, cluster))

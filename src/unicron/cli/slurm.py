"""``unicron slurm run`` and ``unicron slurm node``: options checked here, the work in
``unicron.control.launch.slurmjob``."""

from __future__ import annotations

import os
from pathlib import Path

from unicron.control.launch.slurm import current_allocation, node_slots
from unicron.control.launch.slurmjob import Layout, run_job, run_node, say
from unicron.control.launch.taskfile import read_task_file
from unicron.core.errors import UsageError


def job_root(root: Path | None, job_id: str, workdir: Path) -> Path:
    """The job's shared folder, absolute (every node is given the same path): ``--root``, a
    relative one taken from ``workdir`` (the batch script's working folder: where sbatch was run,
    or its ``--chdir``); by default ``WORKDIR/.unicron/slurm-JOBID``. Not resolved through
    symbolic links: a shared path reads the same on every node."""
    chosen = root.expanduser() if root is not None else Path(".unicron") / f"slurm-{job_id}"
    return Path(os.path.abspath(workdir / chosen))


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
        read_task_file(spec)  # a bad spec, or a program not there, is refused before anything starts
    if slots < 0:
        raise UsageError(f"--slots {slots}: pass a positive number of worker slots per node (or 0: the GPUs)")
    allocation = current_allocation()
    folder = job_root(root, allocation.job_id, Path.cwd())
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(
            f"--root {folder}: cannot create it ({exc.strerror}): pass a folder that every node "
            "shares and you can write"
        ) from None
    passed = _coordinator_args(settings, cluster)
    # --slots 0: each node counts its own GPUs where its agent runs (node_slots)
    return run_job(allocation, Layout(folder, port), specs, slots, passed, wait_s)


def node(root: Path, port: int, slots: int, settings: Path | None, cluster: Path | None) -> int:
    allocation = current_allocation()
    layout = Layout(Path(os.path.abspath(root)), port)
    found = node_slots(os.environ, slots)
    say(f"{allocation.here}: {found}")
    return run_node(allocation, layout, found, _coordinator_args(settings, cluster))

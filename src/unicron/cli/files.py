"""Reading spec files for the command line, with errors that name the file."""

from __future__ import annotations

from pathlib import Path

from unicron.core.errors import SpecError, SpecProblem
from unicron.core.specs import (
    ClusterSpec,
    TaskSpec,
    check_against_cluster,
    parse_cluster,
    parse_tasks,
)


def read_text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        raise SpecError(
            str(path), [SpecProblem("", f"cannot read the file ({exc.strerror})", "check the path")]
        ) from None


def load_specs(cluster_path: Path, tasks_path: Path) -> tuple[ClusterSpec, list[TaskSpec]]:
    cluster = parse_cluster(read_text(cluster_path), str(cluster_path))
    tasks = parse_tasks(read_text(tasks_path), str(tasks_path))
    check_against_cluster(cluster, tasks, str(cluster_path), str(tasks_path))
    return cluster, tasks

"""A task file as it is submitted: its relative paths made absolute, its program checked.

A task file names its program relative to the file's own folder, as a Compose file names its
build context: ``unicron submit examples/tinygpt/task.yaml`` runs the same program from any
folder. The coordinator cannot do this (it has the file's text, not its place), and neither can
an agent (its working directory is its own), so the submitter does it, here, before the text
leaves: ``unicron submit``, ``unicron slurm run`` and the demo.

In ``run.program``:

- the program: after a Python interpreter (``python``, ``python3.11``, ...), the script, the
  first argument that is not an option (none for ``-m`` or ``-c``); else the command itself
  when it is a path (``./run.sh``, ``bin/train``); a bare command (``torchrun``) is looked up
  on each node's ``PATH`` and left as it is. A relative one is taken from the task file's
  folder; one that is not there is refused with the path tried. The check is made here, on the
  submitting machine: the coordinator cannot see the nodes' files. Submitted from a machine
  that does not share the nodes' filesystem, ``--no-resolve`` sends the file as written.
- any other argument that names an existing file or folder relative to the task file's folder
  (``data/train.bin``, ``--config=conf.yaml``: a path with a '/' or a suffix) is made absolute
  too. An argument naming a file not there yet (an output) is left as written: it is relative
  to the worker's working directory, its agent's.

Nothing else in a task is a path (the checkpoint folder is the coordinator's
``--checkpoint-dir``; ``run.env`` values are passed as written).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from unicron.core.errors import SpecError, SpecProblem
from unicron.core.livespecs import LiveTaskSpec, parse_live_tasks
from unicron.core.safeyaml import load_yaml_text

_PYTHON = re.compile(r"python[0-9.]*")
_TAKES_VALUE = frozenset({"-X", "-W"})  # the interpreter's options that take the next argument


@dataclass(frozen=True)
class TaskFile:
    path: Path
    specs: list[LiveTaskSpec]
    text: str  # what to submit: the file's tasks with their paths made absolute (YAML)


def read_task_file(path: Path, resolve: bool = True, escape: str = "") -> TaskFile:
    """The task file at ``path``, validated, with its relative paths made absolute against its
    folder (``resolve``; else as written). Raises :class:`SpecError` naming the file and field
    (``escape``: how to skip the program's check, added to its fix)."""
    try:
        text = path.read_text()
    except OSError as exc:
        problem = SpecProblem("", f"cannot read the file ({exc.strerror})", "check the path")
        raise SpecError(str(path), [problem]) from None
    except UnicodeDecodeError:
        problem = SpecProblem("", "not a text file (UTF-8)", "pass the task's YAML file")
        raise SpecError(str(path), [problem]) from None
    specs = parse_live_tasks(text, str(path))
    if not resolve:
        return TaskFile(path, specs, text)
    data = load_yaml_text(text, str(path))
    several = isinstance(data, Mapping) and "tasks" in data
    raws: list[dict[str, Any]] = list(data["tasks"]) if several else [data]
    folder = Path(os.path.abspath(path)).parent
    problems: list[SpecProblem] = []
    for i, (spec, raw) in enumerate(zip(specs, raws, strict=True)):
        where = f"tasks[{i}].run.program" if several else "run.program"
        argv, missing = resolve_program(spec.run.program, folder, where, escape)
        raw["run"]["program"] = argv
        problems += missing
    if problems:
        raise SpecError(str(path), problems)
    return TaskFile(path, specs, yaml.safe_dump(data, sort_keys=False))


def resolve_program(
    argv: list[str], folder: Path, where: str = "run.program", escape: str = ""
) -> tuple[list[str], list[SpecProblem]]:
    """``argv`` with its program and the arguments naming existing paths made absolute against
    ``folder``, and the problem (naming ``where``) if the program is not there."""
    out = list(argv)
    program = _program_index(argv)
    problems: list[SpecProblem] = []
    for i, word in enumerate(argv):
        if i == program:
            found = _absolute(word, folder)
            if found.exists():
                out[i] = str(found)
            else:
                problems.append(_missing(word, found, folder, f"{where}[{i}]", escape))
        elif i > 0:  # (the first is the program, or the interpreter or command running it)
            out[i] = _argument(word, folder)
    return out, problems


def _program_index(argv: list[str]) -> int | None:
    """Where the program is in ``argv``: the script after an interpreter, or the command when it
    is a path; None when there is none to check (``-m``, ``-c``, a bare command)."""
    if _PYTHON.fullmatch(Path(argv[0]).name):
        i = 1
        while i < len(argv):
            word = argv[i]
            if word in ("-m", "-c", "-"):
                return None
            if word in _TAKES_VALUE:
                i += 2
            elif word.startswith("-"):
                i += 1
            else:
                return i
        return None
    return 0 if "/" in argv[0] else None


def _absolute(word: str, folder: Path) -> Path:
    return Path(word) if os.path.isabs(word) else Path(os.path.normpath(folder / word))


def _argument(word: str, folder: Path) -> str:
    """An argument made absolute if it names a path that exists relative to ``folder`` (also as
    the value of ``--option=VALUE``); else as written."""
    if word.startswith("-"):
        option, equals, value = word.partition("=")
        return f"{option}={_argument(value, folder)}" if equals and value else word
    if os.path.isabs(word) or not ("/" in word or Path(word).suffix) or word.startswith("~"):
        return word
    found = _absolute(word, folder)
    return str(found) if found.exists() else word


def _missing(word: str, tried: Path, folder: Path, field: str, escape: str) -> SpecProblem:
    here = Path.cwd() / word
    hint = (
        f"; it is at {here}, relative to the current folder, but a task file's paths are relative "
        "to the file's own folder"
        if not os.path.isabs(word) and here.exists()
        else ""
    )
    return SpecProblem(
        field,
        f"the program {word!r} is not there: tried {tried}{hint}",
        f"give its path relative to the task file's folder ({folder}) or an absolute one "
        f"(checked on this machine){escape}",
    )

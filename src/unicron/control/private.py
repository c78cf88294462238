"""Files only their owner may read: the coordinator's state directory (0700) and what it keeps
there (the store, whose rows hold every task's programs, arguments and environment; the cluster
secret; the revoked tokens), token files and logs (0600).

A state directory that exists with looser modes is refused, naming the fix (``chmod 700``):
whoever can read it can read the tasks' specs, and whoever can write it can replace the secret.
Files are created private whatever the process's umask, and one found looser (written by an
older version) is made private when it is opened again.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import BinaryIO

from unicron.core.errors import UsageError

DIR_MODE, FILE_MODE = 0o700, 0o600
OTHERS = stat.S_IRWXG | stat.S_IRWXO


def private_dir(path: Path, what: str = "the state directory") -> Path:
    """``path``, created 0700 if missing (its missing parents as usual); refused if it exists
    with modes that let others in."""
    with contextlib.suppress(FileExistsError):
        path.mkdir(parents=True, mode=DIR_MODE)
    info = path.stat()
    if not stat.S_ISDIR(info.st_mode):
        raise UsageError(f"{what} {path} is not a directory: pass a directory (it is created if missing)")
    if info.st_mode & OTHERS:
        raise UsageError(
            f"{what} {path} is open to other users (mode {stat.S_IMODE(info.st_mode):o}): "
            f"chmod 700 {path} (it holds the tasks' specs and the cluster secret)"
        )
    return path


def private_file(path: Path) -> Path:
    """``path`` created empty with mode 0600 if missing, else made 0600 (a file of ours)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, FILE_MODE)
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) != FILE_MODE:
            os.fchmod(fd, FILE_MODE)
    finally:
        os.close(fd)
    return path


def private_log(path: Path) -> BinaryIO:
    """``path`` opened to append, created 0600 (its folder 0700 if missing): a process's output
    may hold whatever its program prints."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, FILE_MODE)
    if stat.S_IMODE(os.fstat(fd).st_mode) & OTHERS:
        os.fchmod(fd, FILE_MODE)
    return os.fdopen(fd, "ab")

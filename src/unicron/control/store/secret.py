"""The cluster secret: what tokens (``control/service/tokens.py``) and the values posted in the
tasks' rendezvous stores (``control/act/rendezvous.py``) are signed with.

The coordinator creates it at its first start, in its state directory, readable by its owner
only (mode 0600); `unicron token create` reads the same file to issue tokens, so issuing one
needs access to the coordinator's host, as a Slurm munge key or a kubeadm CA does.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from unicron.control.private import private_dir
from unicron.core.errors import UsageError

SECRET_FILE = "cluster-secret"


def secret_path(state_dir: Path) -> Path:
    return state_dir / SECRET_FILE


def load_or_create_secret(state_dir: Path) -> bytes:
    """The cluster secret, created (32 random bytes, mode 0600) if the state dir has none (the
    directory is created 0700; one open to others is refused: ``control/private.py``). A secret
    that others can read is refused: anyone who reads it can issue an admin token."""
    path = secret_path(private_dir(state_dir))
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return read_secret(state_dir)
    with os.fdopen(fd, "w") as out:
        out.write(secrets.token_hex(32))
    return read_secret(state_dir)


def read_secret(state_dir: Path) -> bytes:
    path = secret_path(state_dir)
    try:
        mode = path.stat().st_mode
        text = path.read_text().strip()
    except OSError as exc:
        raise UsageError(
            f"cannot read the cluster secret {path} ({exc.strerror}): run this on the coordinator's "
            "host with its --state-dir (the coordinator creates the secret at its first start)"
        ) from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise UsageError(f"the cluster secret {path} is readable by others: chmod 600 {path}")
    if len(text) < 32:
        raise UsageError(f"the cluster secret {path} is too short: delete it and restart the coordinator")
    return text.encode()

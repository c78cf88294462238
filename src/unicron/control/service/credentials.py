"""What a client (the CLI, an agent, the local cluster) sends to prove who it is, and how it
checks the coordinator's certificate.

The token comes from, first to last: ``--token-file``, the file named by ``UNICRON_TOKEN_FILE``,
the token itself in ``UNICRON_TOKEN``. A file is the better home (mode 0600; an environment is
visible to every process of its user via /proc). The CA bundle that signed the coordinator's
TLS certificate comes from ``--ca`` or ``UNICRON_CA``; without one, an https URL is checked
against the system's CAs.
"""

from __future__ import annotations

import os
import ssl
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from unicron.core.errors import UsageError

TOKEN_ENV, TOKEN_FILE_ENV, CA_ENV = "UNICRON_TOKEN", "UNICRON_TOKEN_FILE", "UNICRON_CA"


@dataclass(frozen=True)
class Credentials:
    token: str | None = None
    ca: Path | None = None

    @property
    def headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.token}"} if self.token else {}

    @property
    def verify(self) -> ssl.SSLContext | bool:
        """httpx's ``verify``: a context trusting the CA bundle, or the system's CAs."""
        return ssl.create_default_context(cafile=str(self.ca)) if self.ca is not None else True


def resolve(
    token_file: Path | None = None, ca: Path | None = None, env: Mapping[str, str] | None = None
) -> Credentials:
    """Credentials from the options given, else the environment (see the module's docstring)."""
    environ = os.environ if env is None else env
    file = token_file or (Path(environ[TOKEN_FILE_ENV]) if environ.get(TOKEN_FILE_ENV) else None)
    token = read_token(file) if file is not None else (environ.get(TOKEN_ENV) or None)
    bundle = ca or (Path(environ[CA_ENV]) if environ.get(CA_ENV) else None)
    if bundle is not None and not bundle.is_file():
        raise UsageError(
            f"the CA bundle {bundle} does not exist: pass the coordinator's CA (--ca or {CA_ENV})"
        )
    return Credentials(token, bundle)


def read_token(path: Path) -> str:
    try:
        text = path.read_text().strip()
    except OSError as exc:
        raise UsageError(
            f"cannot read the token file {path} ({exc.strerror}): write one with "
            f"`unicron token create --role ... --output {path}`"
        ) from None
    if not text:
        raise UsageError(f"the token file {path} is empty: write a token from `unicron token create` into it")
    return text


def write_token(path: Path, token: str) -> None:
    """Write a token readable by its owner only (replacing any file there)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)  # a folder made here: private
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, stat.S_IRUSR | stat.S_IWUSR)
    with os.fdopen(fd, "w") as out:
        out.write(token + "\n")

"""The optional parts of an install (pyproject.toml's extras), and the error that names the one
a feature needs when it is missing: the base install is the worker library (``unicron.train``)
alone, so the control plane, plotting and the etcd backend come only with their extras."""

from __future__ import annotations

import importlib
from types import ModuleType

from unicron.core.errors import UsageError

# The modules each extra provides, by the name they are imported as (tests/test_install.py checks
# them against pyproject.toml's extras).
PROVIDES: dict[str, tuple[str, ...]] = {
    "control": (
        "typer",
        "rich",
        "fastapi",
        "uvicorn",
        "uvloop",
        "httptools",
        "httpx",
        "jwt",
        "prometheus_client",
        "setproctitle",
    ),
    "plot": ("matplotlib",),
    "etcd": ("etcd3gw",),
}


class MissingExtra(UsageError):
    """A feature's extra is not installed."""

    def __init__(self, extra: str, purpose: str, module: str) -> None:
        super().__init__(
            f"{purpose} needs the {extra!r} extra, which is not installed here (no module {module!r}):"
            f" pip install 'unicron[{extra}]'"
        )


def extra_of(module: str) -> str | None:
    """The extra that provides ``module`` (a dotted name: its top level counts), if any."""
    top = module.split(".")[0]
    return next((extra for extra, names in PROVIDES.items() if top in names), None)


def require(module: str, extra: str, purpose: str) -> ModuleType:
    """``module``, imported; if it (or what it needs) is not installed, a :class:`MissingExtra`
    naming ``extra`` and ``purpose`` instead of a traceback."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        raise MissingExtra(extra, purpose, exc.name or module) from None


def missing_extra(exc: ModuleNotFoundError, purpose: str) -> MissingExtra | None:
    """The error to show for ``exc`` if an extra's module is what is missing (None: it is not
    one of the extras', a fault of the install to show as it is)."""
    extra = extra_of(exc.name or "")
    return None if extra is None else MissingExtra(extra, purpose, exc.name or "")

"""The torch releases the worker library supports, checked when it is imported.

Recovery in place leans on how torch.distributed behaves, not only on its API: which objects
keep a process group alive after ``destroy_process_group`` (docs/pytorch-notes.md), how DCP's
checkpoint reader plans a load (``dcpfiles.py`` drives its planner), what DDP's gradient hooks
see. Those change between minor releases, so a release is supported once the suite has passed
on it; another is refused at import with the range to install, rather than left to fail inside
a recovery. pyproject.toml states the same range (tests/test_install.py checks that they agree).
"""

from __future__ import annotations

import re

# Oldest supported (inclusive) and first unsupported (major, minor) releases.
OLDEST, BEYOND = (2, 13), (2, 14)
RANGE = f">={OLDEST[0]}.{OLDEST[1]},<{BEYOND[0]}.{BEYOND[1]}"


class UnsupportedTorch(ImportError):
    """The installed torch is outside the supported range."""


def release(version: str) -> tuple[int, int] | None:
    """(major, minor) of a torch version string (``2.13.0+cpu``, ``2.14.0.dev20261101``)."""
    found = re.match(r"(\d+)\.(\d+)", version)
    return None if found is None else (int(found[1]), int(found[2]))


def check(version: str) -> None:
    """Refuse a torch outside ``RANGE``, naming the one found and the fix."""
    found = release(version)
    if found is not None and OLDEST <= found < BEYOND:
        return
    raise UnsupportedTorch(
        f"unicron.train supports torch {RANGE} and this environment has torch {version}: install a"
        f" supported one (pip install 'torch{RANGE}'), or use the Unicron release made for yours"
    )

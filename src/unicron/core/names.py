"""The one alphabet for the names the control plane puts into paths, store keys and tokens.

Task names, node names and token subjects become directory names (checkpoints, logs, the
node's in-memory tier) and keys: letters, digits, '_', '.', '-', starting with a letter or digit,
at most 63 characters. No '/', no leading '.', so no name reaches outside its directory.
"""

from __future__ import annotations

import re

from unicron.core.errors import UsageError

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
NAME_RULE = "1-63 letters, digits, '_', '.', '-', starting with a letter or digit"
_NAME = re.compile(NAME_PATTERN)


def check_name(value: str, field: str) -> str:
    """``value`` if it is a safe name, else a UsageError naming ``field`` and the rule."""
    if not _NAME.fullmatch(value):
        raise UsageError(f"{field} {value[:80]!r} is not a valid name: use {NAME_RULE}")
    return value

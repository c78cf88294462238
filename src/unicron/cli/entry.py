"""The ``unicron`` command's entry point. The command line is the control plane's, which a base
install (the worker library alone) does not have: without the ``control`` extra the command says
which extra to install instead of a traceback."""

from __future__ import annotations

import sys

from unicron.core.extras import missing_extra


def main() -> None:
    try:
        from unicron.cli.main import main as run
    except ModuleNotFoundError as exc:
        missing = missing_extra(exc, "the unicron command")
        if missing is None:
            raise
        print(f"error: {missing}", file=sys.stderr)
        sys.exit(2)
    run()

"""What `unicron coordinator` prints when it starts and when it stops.

A user who starts it must learn, without reading the code, where it serves, where its state
and cluster secret are, where the dashboard is and how to make the tokens every call needs; and,
when it stops, why. One plain line per fact on stderr (like ``ray start``), printed with
``print`` rather than rich: a path or URL holding ``[...]`` must not be read as markup.

The lines come from pure functions so that the docs can show exactly what is printed
(``tests/test_live_start_stop.py`` checks docs/live-cluster.md against them).
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any

import uvicorn


def say(line: str) -> None:
    print(f"coordinator: {line}", file=sys.stderr, flush=True)


def started_lines(url: str, listen: str, state_dir: Path, store: str | None) -> list[str]:
    """The start lines: ``url`` is where agents and users reach it, ``listen`` the host:port its
    socket is bound to (said too when it differs, e.g. 0.0.0.0 behind a host name)."""
    state = state_dir.absolute()  # the token command must work from any folder
    bound = "" if url.split("://", 1)[-1] == listen else f" (listening on {listen})"
    kept = f"state in {store}" if store else "SQLite store"
    create = f"unicron token create --state-dir {state}"
    return [
        f"serving {url}{bound}",
        f"state directory {state} (cluster secret, {kept})",
        f"dashboard {url}/#token=TOKEN (a viewer token: --role viewer)",
        f"an agent's token: {create} --role agent --subject NODE --output NODE.token",
        f"your token: {create} --role admin --output admin.token",
    ]


def stopping_line(why: str) -> str:
    return f"stopping: {why}"


STOPPED = "stopped"
NOT_STARTED = "stopped: it could not start (the error is above)"


class AnnouncingServer(uvicorn.Server):
    """uvicorn's server, saying when it serves (once its socket is bound, so that a port in use
    is never announced) and when and why it stops. A signal is only noted in uvicorn's handler
    and said from the event loop: printing inside a signal handler can re-enter a write to
    stderr that the signal interrupted."""

    def __init__(self, config: uvicorn.Config, lines: list[str]) -> None:
        super().__init__(config)
        self.lines = lines
        self.why: str | None = None

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets)
        if self.started:
            for line in self.lines:
                say(line)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.why = self.why or f"{signal.Signals(sig).name} received"
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets: Any = None) -> None:
        say(stopping_line(self.why or "asked to exit"))
        await super().shutdown(sockets)
        say(STOPPED)


def serve(app: Any, listen: dict[str, Any], lines: list[str]) -> None:
    """Serve ``app`` until a signal stops it. uvicorn raises the signal again once it has shut
    down (the exit status says which); a server that never started exits 3 with a line saying
    so under uvicorn's own error (a port in use, a state that cannot be read)."""
    server = AnnouncingServer(uvicorn.Config(app, log_level="warning", **listen), lines)
    try:
        server.run()
    except SystemExit:
        if not server.started:
            say(NOT_STARTED)
        raise
    if not server.started:  # uvicorn.run's own check: a failed start must not exit 0
        say(NOT_STARTED)
        sys.exit(3)

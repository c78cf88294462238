"""`unicron status --watch` and `unicron events --follow`: the same readings, kept current.

Both poll the coordinator every ``interval`` seconds until Ctrl-C (or ``rounds`` polls, for
tests and scripts). A coordinator that stops answering is said on screen (the last reading stays)
and polled again; nothing exits on a transient error.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterator
from typing import Any

from rich.console import Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from unicron.cli.console import console
from unicron.cli.live import Api, event_cells, status_view
from unicron.core.errors import UnicronError


class Interrupted:
    """Set by Ctrl-C. The handler only sets a flag (taking no lock: it may run while this
    thread holds one) and the loop ends at its next turn, cleanly; raised in the middle of a
    render (rich's lock held) or a request, the interrupt once left a `--watch` running after it."""

    def __init__(self) -> None:
        self.set = False

    def __call__(self, *_: object) -> None:
        self.set = True


@contextlib.contextmanager
def until_interrupted() -> Iterator[Interrupted]:
    stop = Interrupted()
    previous = signal.signal(signal.SIGINT, stop)
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, previous)


def watch_status(api: Api, interval: float, rounds: int | None = None) -> None:
    out = console()
    shown: Group | Text = Text("reading the cluster...")
    # Rendered when updated, by this thread only (no refresh thread to stop at the end).
    with until_interrupted() as stop, Live(shown, console=out, auto_refresh=False, screen=False) as live:
        done = 0
        while (rounds is None or done < rounds) and not stop.set:
            try:
                shown = Group(status_view(api), Text(f"updated {time.strftime('%H:%M:%S')}", style="dim"))
            except UnicronError as exc:
                shown = Group(Text(f"{exc} (retrying every {interval:g} s)", style="red"), shown)
            live.update(shown, refresh=True)
            done += 1
            if rounds is None or done < rounds:
                time.sleep(interval)  # a signal's handler runs meanwhile


def follow_events(api: Api, task: str | None, interval: float, rounds: int | None = None) -> None:
    """Print events as they are recorded (from the newest 20), one row each; an incident's
    outcome is followed by its breakdown."""
    params: dict[str, Any] = {"task": task} if task else {}
    backlog = api.request("GET", "/v1/events", params=params)
    last = backlog[-21]["id"] if len(backlog) > 20 else 0
    done, warned = 0, False
    with until_interrupted() as stop:
        while (rounds is None or done < rounds) and not stop.set:
            last, warned = _follow_round(api, params, last, interval, warned)
            done += 1
            if rounds is None or done < rounds:
                time.sleep(interval)  # a signal's handler runs meanwhile


def _follow_round(
    api: Api, params: dict[str, Any], last: int, interval: float, warned: bool
) -> tuple[int, bool]:
    """One poll of ``follow_events``: print what is new; returns the last id and whether the
    coordinator's silence was said."""
    out = console()
    try:
        rows = api.request("GET", "/v1/events", params={**params, "since": last})
        warned = False
    except UnicronError as exc:
        if not warned:
            out.print(Text(f"{exc} (retrying every {interval:g} s)", style="red"))
        rows, warned = [], True
    for e in rows:
        table = Table.grid(padding=(0, 1))
        table.add_row(*event_cells(e))
        out.print(table)
        if e["kind"] == "outcome":
            out.print(Text(f"    breakdown: {breakdown_line(api, e)}", style="cyan"), soft_wrap=True)
        last = e["id"]
    return last, warned


def breakdown_line(api: Api, outcome: dict[str, Any]) -> str:
    incident = outcome["detail"].get("incident")
    found = api.request("GET", "/v1/incidents", params={"task": outcome["task"]} if outcome["task"] else {})
    summary = next((b["summary"] for b in found if b["incident"] == incident), "not found")
    return f"incident {incident}: {summary}"

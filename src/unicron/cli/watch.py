"""`unicron status --watch` and `unicron events --follow`: the same readings, kept current.

Both poll the coordinator every ``interval`` seconds until Ctrl-C (or ``rounds`` polls, for
tests and scripts). A coordinator that stops answering is said on screen (the last reading stays)
and polled again; nothing exits on a transient error.
"""

from __future__ import annotations

import time
from typing import Any

from rich.console import Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from unicron.cli.console import console
from unicron.cli.live import Api, event_cells, status_view
from unicron.core.errors import UnicronError


def watch_status(api: Api, interval: float, rounds: int | None = None) -> None:
    out = console()
    shown: Group | Text = Text("reading the cluster...")
    with Live(shown, console=out, refresh_per_second=4, screen=False) as live:
        done = 0
        while rounds is None or done < rounds:
            try:
                shown = Group(status_view(api), Text(f"updated {time.strftime('%H:%M:%S')}", style="dim"))
            except UnicronError as exc:
                shown = Group(Text(f"{exc} (retrying every {interval:g} s)", style="red"), shown)
            live.update(shown)
            done += 1
            if rounds is None or done < rounds:
                time.sleep(interval)


def follow_events(api: Api, task: str | None, interval: float, rounds: int | None = None) -> None:
    """Print events as they are recorded (from the newest 20), one row each; an incident's
    outcome is followed by its breakdown."""
    params: dict[str, Any] = {"task": task} if task else {}
    out = console()
    backlog = api.request("GET", "/v1/events", params=params)
    last = backlog[-21]["id"] if len(backlog) > 20 else 0
    done, warned = 0, False
    while rounds is None or done < rounds:
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
        done += 1
        if rounds is None or done < rounds:
            time.sleep(interval)


def breakdown_line(api: Api, outcome: dict[str, Any]) -> str:
    incident = outcome["detail"].get("incident")
    found = api.request("GET", "/v1/incidents", params={"task": outcome["task"]} if outcome["task"] else {})
    summary = next((b["summary"] for b in found if b["incident"] == incident), "not found")
    return f"incident {incident}: {summary}"

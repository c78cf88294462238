"""`unicron logs TASK`: a worker's output (its stdout and stderr), read by the agent of the node
that ran it and relayed by the coordinator (``control/service/logrelay.py``), as `kubectl logs`.

The text goes to stdout as it is in the file; anything else (that the start was left out) goes
to stderr. ``--follow`` reads on from where the last read ended, every ``interval`` seconds (at
once while a read comes back full), until the worker has exited and all of its output is shown,
or Ctrl-C.
"""

from __future__ import annotations

import os
import re
import sys
import time
from typing import Any, TextIO
from urllib.parse import quote

from unicron.cli.live import Api
from unicron.cli.watch import until_interrupted
from unicron.core.names import check_name
from unicron.core.protocol import LOG_CHUNK_BYTES

RUN = re.compile(r"[0-9]{1,18}")


def task_path(name: str) -> str:
    """The API path of task ``name``'s logs: NAME, or NAME#RUN, an ended run kept when its name
    was submitted again."""
    base, mark, run = name.partition("#")
    check_name(base if mark and RUN.fullmatch(run) else name, "task name")
    return f"/v1/tasks/{quote(name, safe='')}/logs"


def show_logs(
    api: Api,
    task: str,
    rank: int,
    generation: int | None,
    tail: int | None,
    follow: bool,
    interval: float,
    out: TextIO | None = None,
) -> None:
    """Print the log of ``task``'s ``rank`` (see the module's docstring)."""
    path, shown = task_path(task), out or sys.stdout
    params: dict[str, Any] = {"rank": rank}
    if generation is not None:
        params["generation"] = generation
    got = api.request("GET", path, params=params | ({"tail": tail} if tail is not None else {}))
    _print(got, shown)
    if got["capped"]:
        print(capped_note(got), file=sys.stderr)
    if not follow:
        return
    params["generation"] = got["generation"]  # this worker's file, whatever the task does next
    with until_interrupted() as stop:
        while not stop.set and (got["running"] or got["next_offset"] < got["size"]):
            if got["next_offset"] >= got["size"]:  # all read: wait for more
                time.sleep(interval)  # (a Ctrl-C's handler runs meanwhile)
                if stop.set:
                    break
            got = api.request("GET", path, params={**params, "offset": got["next_offset"]})
            _print(got, shown)


def _print(got: dict[str, Any], out: TextIO) -> None:
    if not got["text"]:
        return
    try:
        out.write(got["text"])
        out.flush()
    except BrokenPipeError:  # `unicron logs ... | head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), out.fileno())
        raise SystemExit(0) from None


def capped_note(got: dict[str, Any]) -> str:
    return (
        f"(the start of this log is left out: it holds {got['size']} bytes and one read returns at "
        f"most {LOG_CHUNK_BYTES // 1024} KiB; the whole file is {got['path']} on node {got['node']}, "
        "or fewer lines with --tail N)"
    )

"""Bounds on what the control plane accepts from outside, so that no input, however built, costs
more than a bounded amount of memory and time or reaches a traceback.

The figures are generous for real specs (the largest example is ~2 KB and 4 levels deep) and
small enough that the worst case is cheap: a YAML alias bomb of a few hundred bytes expands to
billions of nodes, a 10 MB body took 10 s of the coordinator's event loop to parse, 100k-deep
nesting overflowed the parser's recursion (measured by the probe in issue 13).
"""

from __future__ import annotations

import functools
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import Field, ValidationInfo

from unicron.core.errors import SpecProblem

MAX_BODY_BYTES = 1 << 20  # one request body (a task spec, a heartbeat with its reports)
MAX_SPEC_BYTES = 1 << 20  # one YAML or JSON spec
MAX_SPEC_NODES = 100_000  # scalars, lists and mappings in a spec, aliases counted expanded
MAX_SPEC_DEPTH = 64  # nesting of lists and mappings
MAX_ECHO_CHARS = 60  # of a bad value quoted back in an error (never the whole input)
MAX_INT = 2**63 - 1  # what the store (SQLite INTEGER) holds
# An integer in a message from outside: one the store can hold and JSON carries exactly (a float
# 2**63 - 1 rounds up past SQLite's range), with its bounds published in the schema.
MAX_JSON_INT = 2**53 - 1
Int = Annotated[int, Field(ge=-MAX_JSON_INT, le=MAX_JSON_INT)]

# What one submission may hold, checked on the parsed document before any model is built (so
# that a body under MAX_BODY_BYTES costs the coordinator milliseconds, not seconds: a 10,000-task
# list took 7 s to refuse, issue 53) and again by the models' fields.
MAX_TASKS_PER_SUBMIT = 100  # entries of `tasks:`
MAX_ENV_KEYS = 256  # variables in a task's run.env
MAX_ARGS = 1024  # a task's run.program (its argv)
MAX_PRELOAD = 64  # modules in a task's run.preload
MAX_FAULTS = 256  # a task's run.faults
MAX_FAULT_TIMES = 1000  # how often one injected fault strikes (run.faults[].times)
MAX_TABLE_ROWS = 1024  # a task's throughput table
MAX_ENTRIES = 4096  # any other list or mapping in a spec
MAX_TEXT_CHARS = 65_536  # any string in a spec (an argument, a variable's value)

# What one agent's message (a registration, a heartbeat) may hold, checked on the parsed body
# before any model is built (``core/protocol.py``: AGENT_BOUNDS) and again by the models' fields.
# With an agent token, a heartbeat under MAX_BODY_BYTES could list 13,000 workers or 8,000
# reports, each validated and handled on the coordinator's loop (12,000 stray workers held it
# 268 s; issue 53). Each bound is beyond what a real agent sends: it lists its running workers
# (at most its slots, with those still stopping) and those that exited lately, and splits its
# reports across heartbeats (``control/agent/agent.py``, ``control/agent/backlog.py``).
MAX_SLOTS = 256  # worker slots (GPUs) of one node: 8 on today's GPU nodes, 16 on the largest
MAX_LISTED_WORKERS = 4 * MAX_SLOTS  # workers one message lists, exited ones included
MAX_REPORTS_PER_BEAT = 500  # reports in one heartbeat: the agent sends more in the next ones
MAX_PEERS = 8192  # a task's other nodes one node cannot reach (65,536 GPUs at 8 a node)
MAX_SKIPPED = 64  # checkpoint copies one restored worker passed over (it keeps 3 per tier)
MAX_FIELDS = 32  # entries of a message's own mapping (the widest message has 12 fields)
MAX_STACK_CHARS = 64_000  # one worker's stack dump, as its agent reads it
MAX_STACKS_CHARS = 256_000  # a stacks report's dumps together: the agent shares this among them
MAX_LABEL_CHARS = 255  # a name, an id, a kind (a task, a GPU, a host, an exception's type)
MAX_NOTE_CHARS = 4096  # a path (PATH_MAX), a message, a traceback's end

# The ranges of numbers from outside (docs/reference.md lists every field's, from the models).
MAX_WORKERS = 1 << 20  # a count of workers (GPUs) or a rank
MAX_SECONDS = 1_000_000.0  # a duration (about 11.6 days)
MAX_UNIX_TIME = 1e10  # a moment (Unix time, the year 2286)
MAX_FLOPS = 1e30  # a rate in FLOP/s, or the FLOPs of one sample
MAX_WEIGHT = 1e6  # a task's weight
MAX_STATE_BYTES = 1e18  # bytes of a task's state (an exabyte)
MAX_MODEL_SIZE = 1 << 31  # any one dimension of a model (layers, width, vocabulary, batch...)
Seconds = Annotated[float, Field(ge=0, le=MAX_SECONDS, allow_inf_nan=False)]
UnixTime = Annotated[float, Field(ge=0, le=MAX_UNIX_TIME, allow_inf_nan=False)]
Steps = Annotated[int, Field(ge=1, le=MAX_JSON_INT)]  # a count of optimizer steps, or a step


@dataclass(frozen=True)
class Bound:
    """At most ``entries`` entries (``what``) in the list or mapping at a field path; ``fix``
    says what to do instead."""

    entries: int
    what: str
    fix: str


# A field path: mapping keys, "[]" for any entry of a list (``("tasks", "[]", "run", "env")``).
Bounds = Mapping[tuple[str, ...], Bound]


class EntryBounds:
    """Bounds by field path, checked on a parsed JSON document (``first_excess``) before any
    model is built from it. Every path's prefixes must be bounded too: only bounded paths are
    visited, each one's entries counted before any of them is, so a check costs what the bounded
    containers hold (thousands of entries at most), not what the body does. It runs on the
    coordinator's loop for each heartbeat, where walking every value of a body (as
    ``core/safeyaml.py`` walks a submission, in a thread) would cost more than validating it."""

    def __init__(self, bounds: Bounds) -> None:
        unbounded = [p[:i] for p in bounds for i in range(len(p)) if p[:i] not in bounds]
        if unbounded:
            raise ValueError(f"bound {unbounded[0]} too: a check would go through it unbounded")
        self.bounds = dict(bounds)
        # Under each path: the bounded path of a list's entries (or None), and a mapping's keys
        # that lead on to bounded paths, each with its path.
        self.entries = {path: (*path, "[]") if (*path, "[]") in bounds else None for path in bounds}
        self.keys = {path: [(key, (*path, key)) for key in _keys_below(bounds, path)] for path in bounds}

    def first_excess(self, value: Any, where: str) -> SpecProblem | None:
        """The first list or mapping of ``value`` (found at ``where``) holding more entries than
        its bound, or None."""
        found = self._excess(value, ()) if isinstance(value, list | dict) else None
        if found is None:
            return None
        steps, bound = found
        place = ".".join([where, *(str(step) for step in reversed(steps))])
        return SpecProblem(place, f"more than {bound.entries} {bound.what}", bound.fix)

    def _excess(self, value: Any, path: tuple[str, ...]) -> tuple[list[str | int], Bound] | None:
        """The bound exceeded and the keys and indexes that lead to it, innermost first."""
        bound = self.bounds[path]
        if len(value) > bound.entries:
            return [], bound
        if isinstance(value, list):
            entry = self.entries[path]
            if entry is None:
                return None
            for index, item in enumerate(value):
                if isinstance(item, list | dict) and (found := self._excess(item, entry)):
                    found[0].append(index)
                    return found
            return None
        for key, below in self.keys[path]:
            item = value.get(key)
            if isinstance(item, list | dict) and (found := self._excess(item, below)):
                found[0].append(key)
                return found
        return None


def _keys_below(bounds: Bounds, path: tuple[str, ...]) -> list[str]:
    """The mapping keys under ``path`` that lead on to a bounded path."""
    depth = len(path)
    return sorted({p[depth] for p in bounds if len(p) > depth and p[:depth] == path} - {"[]"})


def brief(value: Any) -> str:
    """``repr(value)``, cut to a few dozen characters: errors name the value, never echo the input."""
    text = repr(value)
    return text if len(text) <= MAX_ECHO_CHARS else text[: MAX_ECHO_CHARS - 3] + "..."


def _numeric(annotation: Any) -> bool:
    """An int or float field (or an optional one), where pydantic would read True as 1."""
    if annotation in (int, float):
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(_numeric(a) for a in typing.get_args(annotation) if a is not type(None))
    if typing.get_origin(annotation) is typing.Annotated:
        return _numeric(typing.get_args(annotation)[0])
    return False


def refuse_bool_for_number(cls: Any, value: Any, info: ValidationInfo) -> Any:
    """A field validator (mode "before", on every field) refusing ``true``/``false`` where a
    number is expected: pydantic's lax mode reads them as 1 and 0, so ``weight: true`` would be
    a task of weight 1."""
    if isinstance(value, bool) and info.field_name is not None:
        field = cls.model_fields.get(info.field_name)
        if field is not None and _numeric(field.annotation):
            raise ValueError("a boolean is not a number")
    return value


def refuse_bool_numbers(cls: Any, data: Any) -> Any:
    """The same as a model validator (mode "before"), for models whose fields cannot each take
    a validator (a discriminated union's tag)."""
    if isinstance(data, dict):
        for key in _numeric_keys(cls):
            if isinstance(data.get(key), bool):
                raise ValueError(f"{key}: a boolean is not a number (got {data[key]!r})")
    return data


@functools.cache
def _numeric_keys(cls: Any) -> tuple[str, ...]:
    """The keys of a model's numeric fields, found once: a heartbeat validates thousands of
    messages, and reading each one's fields took half the time of validating it."""
    fields = cls.model_fields.items()
    return tuple(field.alias or name for name, field in fields if _numeric(field.annotation))

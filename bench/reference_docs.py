"""docs/reference.md: the training library's entry points and the live task YAML, written from
the code itself (signatures, docstrings, the specs' pydantic fields), so that the reference
cannot drift from what the code accepts; and docs/security.md's table of what an agent's
message may hold (between its markers). Run by `make docs` and `make bench`;
tests/test_reference_docs.py checks that the committed files are current.
"""

from __future__ import annotations

import inspect
import re
import textwrap
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from unicron.core import limits
from unicron.core.livespecs import FaultSpec, LiveTaskList, LiveTaskSpec, RunSpec
from unicron.core.protocol import AGENT_BOUNDS, Heartbeat, LogChunk, Registration
from unicron.core.ranges import NumberRange, field_path, number_ranges, size_bounds
from unicron.core.settings import Settings
from unicron.core.specs import ModelSpec
from unicron.core.workerenv import KEYS
from unicron.train import Session

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "reference.md"
SECURITY = ROOT / "docs" / "security.md"
AGENT_MARKERS = ("<!-- agent_bounds -->", "<!-- /agent_bounds -->")
METHODS = [
    "start",
    "register",
    "metric",
    "loader",
    "steps",
    "close",
    "forward_exception",
]
# Session(...) keyword -> the worker-contract field that wins over it when the agent sets it.
PRECEDENCE = {
    "iterations": "iterations",
    "checkpoint_dir": "checkpoint_dir",
    "checkpoint_every": "checkpoint_every",
    "timeout_s": "pg_timeout_s",
}
SECTIONS: list[tuple[str, type[BaseModel]]] = [
    ("Task (top level)", LiveTaskSpec),
    ("`model:`", ModelSpec),
    ("`run:`", RunSpec),
    ("`run.faults[]`", FaultSpec),
]


def type_name(annotation: Any) -> str:
    """As a reader writes it: ``int | None``, ``dict[int, float]``; constraints (``Annotated``)
    go to the limits column."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return type_name(args[0])
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if annotation is type(None):
        return "None"
    if origin in (list, dict, tuple):
        return f"{origin.__name__}[{', '.join(type_name(a) for a in args)}]"
    text = str(annotation) if not isinstance(annotation, type) else annotation.__name__
    return re.sub(r"\b(typing|unicron(\.\w+)*)\.", "", text)


def default_of(model: type[BaseModel], name: str) -> str:
    field = model.model_fields[name]
    if field.is_required():
        return "required"
    factory: Callable[[], Any] | None = field.default_factory  # type: ignore[assignment]
    return f"`{factory()!r}`" if factory is not None else f"`{field.default!r}`"


def constraints(annotation: Any) -> list[Any]:
    """The constraints an optional or ``Annotated`` type carries itself (not its items')."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return [m for extra in args[1:] for m in getattr(extra, "metadata", [extra])]
    if origin in (typing.Union, types.UnionType):
        return [m for a in args for m in constraints(a)]
    return []


def limits_of(model: type[BaseModel], name: str) -> str:
    """Constraints such as gt=0 or min_length=1, from the field's metadata."""
    out = []
    field = model.model_fields[name]
    for item in [*field.metadata, *constraints(field.annotation)]:
        for key in ("gt", "ge", "lt", "le", "min_length", "max_length", "pattern"):
            value = getattr(item, key, None)
            if value is not None:
                out.append(f"{key} {value:g}" if isinstance(value, float) else f"{key} {value}")
    return ", ".join(out)


def field_table(model: type[BaseModel]) -> str:
    rows = ["| field | type | default | limits | meaning |", "|---|---|---|---|---|"]
    for name, field in model.model_fields.items():
        meaning = (field.description or "").replace("|", "\\|")
        limits = limits_of(model, name).replace("|", "\\|")
        kind, default = type_name(field.annotation).replace("|", "\\|"), default_of(model, name)
        rows.append(f"| `{name}` | `{kind}` | {default} | {limits} | {meaning} |")
    return "\n".join(rows)


def signature_of(function: Callable[..., Any]) -> str:
    """As written in the source (annotations are strings there: ``from __future__``), less self."""
    text = str(inspect.signature(function)).replace("'", "")
    return text.replace("(self, ", "(").replace("(self)", "()")


def method_section(name: str) -> str:
    method = getattr(Session, name)
    return f"### `session.{name}{signature_of(method)}`\n\n{inspect.getdoc(method)}\n"


def precedence_table() -> str:
    defaults = {
        "iterations": "0: no steps",
        "checkpoint_dir": "none: no checkpoints",
        "checkpoint_every": "0: only `finish` saves",
        "timeout_s": f"`Settings.process_group_timeout_s` ({Settings().process_group_timeout_s:g} s)",
    }
    rows = ["| keyword | agent's variable (wins) | without either |", "|---|---|---|"]
    for keyword, field in PRECEDENCE.items():
        rows.append(f"| `{keyword}` | `{KEYS[field]}` | {defaults[keyword]} |")
    return "\n".join(rows)


# The API's request bodies with numbers in them (the other bodies, a drain's reason and a
# revocation's token id, hold none; queries' bounds are in the OpenAPI schema).
REQUESTS: list[tuple[str, type[BaseModel]]] = [
    ("`POST /v1/tasks` (a submission; one task alone: the same without `tasks[].`)", LiveTaskList),
    ("`POST /v1/agents/register`", Registration),
    ("`POST /v1/agents/heartbeat`", Heartbeat),
    ("`POST /v1/agents/{node}/logs`", LogChunk),
]


def bound_text(value: float) -> str:
    if value == limits.MAX_JSON_INT:
        return "2^53 - 1"
    if value == -limits.MAX_JSON_INT:
        return "-(2^53 - 1)"
    return str(value) if isinstance(value, int) else f"{value:g}"


def range_text(r: NumberRange) -> str:
    low = "" if r.low is None else f"{bound_text(r.low)} {'<' if r.low_open else '≤'} "
    high = "" if r.high is None else f" {'<' if r.high_open else '≤'} {bound_text(r.high)}"
    return f"{low}x{high}"


def ranges_section() -> str:
    parts = []
    for title, model in REQUESTS:
        rows = ["| field | type | range |", "|---|---|---|"]
        rows += [f"| `{r.path}` | {r.kind} | {range_text(r)} |" for r in number_ranges(model)]
        parts.append(f"### {title}\n\n" + "\n".join(rows))
    return "\n\n".join(parts)


def render() -> str:
    template = (Path(__file__).parent / "templates" / "reference.md").read_text()
    return template.format(
        init_signature=signature_of(Session.__init__).replace(" -> None", ""),
        precedence=precedence_table(),
        methods="\n".join(method_section(m) for m in METHODS),
        env="\n".join(f"| `{key}` | `{field}` |" for field, key in KEYS.items()),
        fields="\n\n".join(f"### {title}\n\n{field_table(model)}" for title, model in SECTIONS),
        ranges=ranges_section(),
        max_tasks=limits.MAX_TASKS_PER_SUBMIT,
        max_env=limits.MAX_ENV_KEYS,
        max_args=limits.MAX_ARGS,
        max_faults=limits.MAX_FAULTS,
        max_rows=limits.MAX_TABLE_ROWS,
        max_entries=f"{limits.MAX_ENTRIES:,}",
        max_text=f"{limits.MAX_TEXT_CHARS:,}",
    )


def agent_bounds_section() -> str:
    """What an agent's registration or heartbeat may hold: each list's and mapping's bound (as
    checked before validation, ``AGENT_BOUNDS``) and each text's, from the models' fields."""
    sizes = [s for model in (Registration, Heartbeat) for s in size_bounds(model)]
    slots = next(r for r in number_ranges(Registration) if r.path == "slots")
    rows = ["| field | at most |", "|---|---|", f"| `slots` | {bound_text(slots.high or 0)} |"]
    counted: dict[str, str] = {}
    for s in sizes:
        if s.kind != "text" and s.most is not None:
            what = AGENT_BOUNDS.bounds[field_path(s.path)].what
            counted.setdefault(dotted(field_path(s.path)), f"{s.most:,} {what}")
    rows += [f"| `{path}` | {most} |" for path, most in counted.items()]
    fields = [path for path, bound in AGENT_BOUNDS.bounds.items() if bound.what == "fields"]
    messages = [f"`{dotted(p)}`" if p else "the message" for p in fields]
    rows.append(f"| {', '.join(messages)} (each) | {limits.MAX_FIELDS} fields |")
    texts: dict[int, list[str]] = {}
    for s in sizes:
        if s.kind == "text" and s.most is not None:
            named = texts.setdefault(s.most, [])
            if (path := dotted(field_path(s.path))) not in named:
                named.append(path)
    for most, paths in sorted(texts.items()):
        rows.append(f"| {', '.join(f'`{p}`' for p in paths)} | {most:,} characters |")
    example = AGENT_BOUNDS.first_excess({"workers": [{}] * (limits.MAX_LISTED_WORKERS + 1)}, "body")
    assert example is not None
    intro = (
        "What an agent's registration or heartbeat may hold, written from the models by "
        "`bench/reference_docs.py` (`make docs`). A refusal (422) names the field and the limit: "
        f"`{example.render()}`. The agent sends at most {limits.MAX_REPORTS_PER_BEAT} reports in a "
        "heartbeat, within the body's limit, and the rest in the heartbeats that follow at once; it "
        f"shares {limits.MAX_STACKS_CHARS:,} characters among the stacks of one report."
    )
    return f"{textwrap.fill(intro, 98, break_long_words=False)}\n\n" + "\n".join(rows) + "\n"


def dotted(path: tuple[str, ...]) -> str:
    """A field path as written: ``reports[].stacks``."""
    return ".".join(path).replace(".[]", "[]")


def with_agent_bounds(page: str) -> str:
    """``page`` (docs/security.md) with the table between its markers written anew."""
    start, end = AGENT_MARKERS
    head, rest = page.split(start)
    return f"{head}{start}\n{agent_bounds_section()}{end}{rest.split(end)[1]}"


def main() -> None:
    OUT.write_text(render())
    SECURITY.write_text(with_agent_bounds(SECURITY.read_text()))


if __name__ == "__main__":
    main()

"""docs/reference.md: the training library's entry points and the live task YAML, written from
the code itself (signatures, docstrings, the specs' pydantic fields), so that the reference
cannot drift from what the code accepts. Run by `make docs` and `make bench`;
tests/test_reference_docs.py checks that the committed file is current.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from unicron.core.livespecs import FaultSpec, LiveTaskSpec, RunSpec
from unicron.core.settings import Settings
from unicron.core.specs import ModelSpec
from unicron.core.workerenv import KEYS
from unicron.train import Session

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "reference.md"
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
    text = str(annotation) if not isinstance(annotation, type) else annotation.__name__
    return re.sub(r"\b(typing|unicron(\.\w+)*)\.", "", text)


def default_of(model: type[BaseModel], name: str) -> str:
    field = model.model_fields[name]
    if field.is_required():
        return "required"
    factory: Callable[[], Any] | None = field.default_factory  # type: ignore[assignment]
    return f"`{factory()!r}`" if factory is not None else f"`{field.default!r}`"


def limits_of(model: type[BaseModel], name: str) -> str:
    """Constraints such as gt=0 or min_length=1, from the field's metadata."""
    out = []
    for item in model.model_fields[name].metadata:
        for key in ("gt", "ge", "lt", "le", "min_length", "max_length", "pattern"):
            value = getattr(item, key, None)
            if value is not None:
                out.append(f"{key} {value}")
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


def render() -> str:
    template = (Path(__file__).parent / "templates" / "reference.md").read_text()
    return template.format(
        init_signature=signature_of(Session.__init__).replace(" -> None", ""),
        precedence=precedence_table(),
        methods="\n".join(method_section(m) for m in METHODS),
        env="\n".join(f"| `{key}` | `{field}` |" for field, key in KEYS.items()),
        fields="\n\n".join(f"### {title}\n\n{field_table(model)}" for title, model in SECTIONS),
    )


def main() -> None:
    OUT.write_text(render())


if __name__ == "__main__":
    main()

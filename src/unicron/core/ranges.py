"""The range of every number a model accepts, read from its fields' constraints: what
docs/reference.md tabulates (``bench/reference_docs.py``) and what ``tests/test_api_numbers.py``
checks every request model against (each number bounded on both sides, within int64, finite),
so that neither the table nor a new field can drift from what the API enforces. Likewise the
size of every text, list and mapping (``size_bounds``: docs/security.md's table of an agent's
messages, ``tests/test_agent_bounds.py``)."""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel


@dataclass(frozen=True)
class NumberRange:
    """A numeric field's range (None: unbounded on that side); ``finite``: NaN and infinities
    are refused."""

    path: str  # e.g. run.faults[].seconds; a union's member named: reports[](IterationReport).step
    kind: str  # "integer" or "number"
    low: float | None
    low_open: bool
    high: float | None
    high_open: bool
    finite: bool


def number_ranges(model: type[BaseModel]) -> list[NumberRange]:
    """Every number in ``model`` and the models its fields hold (lists, mappings, unions)."""
    return [_range(kind, metadata, path) for kind, metadata, path in _types(model) if kind in (int, float)]


def _types(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[Any, list[Any], str]]:
    """Every type in ``model``'s fields and in what they hold (lists' items, mappings' keys and
    values, unions' members, models' fields), each with the constraints on it and its path."""
    for name, field in model.model_fields.items():
        yield from _walk(field.annotation, list(field.metadata), f"{prefix}.{name}" if prefix else name)


def _walk(annotation: Any, metadata: list[Any], path: str) -> Iterator[tuple[Any, list[Any], str]]:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        inner = [m for extra in args[1:] for m in getattr(extra, "metadata", [extra])]
        yield from _walk(args[0], metadata + inner, path)
        return
    if origin in (typing.Union, types.UnionType):
        members = [a for a in args if a is not type(None)]
        named = len([a for a in members if isinstance(a, type) and issubclass(a, BaseModel)]) > 1
        for a in members:
            yield from _walk(a, metadata, f"{path}({a.__name__})" if named else path)
        return
    yield annotation, metadata, path
    if origin in (list, tuple):
        for a in args:
            if a is not Ellipsis:
                yield from _walk(a, [], f"{path}[]")
    elif origin is dict:
        yield from _walk(args[0], [], f"{path} (key)")
        yield from _walk(args[1], [], f"{path}.*")
    elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield from _types(annotation, path)


def _range(kind: type, metadata: list[Any], path: str) -> NumberRange:
    lows = [(m.gt, True) for m in metadata if getattr(m, "gt", None) is not None]
    lows += [(m.ge, False) for m in metadata if getattr(m, "ge", None) is not None]
    highs = [(m.lt, True) for m in metadata if getattr(m, "lt", None) is not None]
    highs += [(m.le, False) for m in metadata if getattr(m, "le", None) is not None]
    low = max(lows, key=lambda b: (b[0], b[1])) if lows else (None, False)
    high = min(highs, key=lambda b: (b[0], not b[1])) if highs else (None, False)
    infinite = any(getattr(m, "allow_inf_nan", True) is False for m in metadata)
    return NumberRange(
        path,
        "integer" if kind is int else "number",
        low[0],
        low[1],
        high[0],
        high[1],
        finite=kind is int or infinite,
    )


@dataclass(frozen=True)
class SizeBound:
    """A text's, list's or mapping's largest size (None: unbounded), and a text's pattern."""

    path: str  # as in NumberRange: reports[](StacksReport).stacks
    kind: str  # "text", "list" or "mapping"
    most: int | None
    pattern: str | None = None


def size_bounds(model: type[BaseModel]) -> list[SizeBound]:
    """Every text, list and mapping in ``model`` and the models its fields hold: what
    docs/security.md tabulates of an agent's messages and ``tests/test_agent_bounds.py`` checks
    against the bounds checked before validation (``core/protocol.py``: AGENT_BOUNDS)."""
    found: list[SizeBound] = []
    for kind, metadata, path in _types(model):
        origin = typing.get_origin(kind)
        most = next((m.max_length for m in metadata if getattr(m, "max_length", None) is not None), None)
        if origin in (list, dict):
            found.append(SizeBound(path, "list" if origin is list else "mapping", most))
        elif kind is str:
            pattern = next((m.pattern for m in metadata if getattr(m, "pattern", None) is not None), None)
            found.append(SizeBound(path, "text", most, pattern))
    return found


def field_path(path: str) -> tuple[str, ...]:
    """A size's path as a bound's (``core/limits.py``: Bounds): ``reports[](StacksReport).stacks``
    is ``("reports", "[]", "stacks")``."""
    plain = re.sub(r"\([A-Za-z]+\)", "", path).replace("[]", ".[]")
    return tuple(part for part in plain.split(".") if part)

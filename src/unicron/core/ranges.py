"""The range of every number a model accepts, read from its fields' constraints: what
docs/reference.md tabulates (``bench/reference_docs.py``) and what ``tests/test_api_numbers.py``
checks every request model against (each number bounded on both sides, within int64, finite),
so that neither the table nor a new field can drift from what the API enforces."""

from __future__ import annotations

import types
import typing
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


def number_ranges(model: type[BaseModel], prefix: str = "") -> list[NumberRange]:
    """Every number in ``model`` and the models its fields hold (lists, mappings, unions)."""
    found: list[NumberRange] = []
    for name, field in model.model_fields.items():
        path = f"{prefix}.{name}" if prefix else name
        found += _ranges(field.annotation, list(field.metadata), path)
    return found


def _ranges(annotation: Any, metadata: list[Any], path: str) -> list[NumberRange]:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        inner = [m for extra in args[1:] for m in getattr(extra, "metadata", [extra])]
        return _ranges(args[0], metadata + inner, path)
    if origin in (typing.Union, types.UnionType):
        members = [a for a in args if a is not type(None)]
        named = len([a for a in members if isinstance(a, type) and issubclass(a, BaseModel)]) > 1
        return [r for a in members for r in _ranges(a, metadata, f"{path}({a.__name__})" if named else path)]
    if origin in (list, tuple):
        return [r for a in args if a is not Ellipsis for r in _ranges(a, [], f"{path}[]")]
    if origin is dict:
        return _ranges(args[0], [], f"{path} (key)") + _ranges(args[1], [], f"{path}.*")
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return number_ranges(annotation, path)
    if annotation in (int, float):
        return [_range(annotation, metadata, path)]
    return []


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

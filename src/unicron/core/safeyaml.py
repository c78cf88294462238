"""YAML (and JSON, a subset of it) from outside, parsed safely and within bounds: safe types
only, a bounded size, node count (aliases expanded), depth, text length and number of entries
of each list and mapping (``Bound``s by field path: a submission's tasks, a task's variables);
errors quote no more than a few characters of the input.

Every bound is checked before anything expensive is built: JSON is parsed by the C parser (a
megabyte in milliseconds) and walked; YAML is checked event by event as libyaml reads it, so a
10,000-entry list or a 100,000-deep document is refused at the first entry or level past its
bound, and only a document within every bound is composed and constructed.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NoReturn

import yaml

from unicron.core.errors import SpecError, SpecProblem
from unicron.core.limits import (
    MAX_ENTRIES,
    MAX_SPEC_BYTES,
    MAX_SPEC_DEPTH,
    MAX_SPEC_NODES,
    MAX_TEXT_CHARS,
    Bound,
    Bounds,
    brief,
)

Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's, where PyYAML has it


ANY = Bound(MAX_ENTRIES, "entries", f"write at most {MAX_ENTRIES} entries in one list or mapping")
DEEP = f"nested deeper than {MAX_SPEC_DEPTH} levels"


def load_yaml_text(text: str, source: str, bounds: Bounds | None = None) -> Any:
    """YAML (or JSON) parsed safely, within core.limits: its size, its node count with aliases
    expanded (an alias bomb is refused before anything expands it), its depth; with ``bounds``
    (a request's body), also its lists' and mappings' entries (by field path; others: ``ANY``)
    and its texts' lengths (``MAX_TEXT_CHARS``). A local file (a cluster, a trace) may be larger."""
    if len(text) > MAX_SPEC_BYTES:
        raise SpecError(source, [SpecProblem("", f"larger than {MAX_SPEC_BYTES} bytes", "split it up")])
    checker = _Checker(source, bounds)
    if text.lstrip()[:1] in ("{", "["):
        found = _json(text, checker)
        if found is not None:
            checker.walk(found[0], (), "", 0)
            return found[0]
    try:
        checker.events(yaml.parse(text, Loader=Loader))
        return _construct(text, source)
    except RecursionError:
        checker.refuse("", DEEP, "flatten it")
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        checker.refuse(where, f"not valid YAML: {brief(problem)[1:-1]}", "correct the YAML syntax")
    except ValueError as exc:  # a value its type cannot hold (a 5,000-digit number, a 13th month)
        _unreadable(checker, exc)


def _json(text: str, checker: _Checker) -> tuple[Any] | None:
    """``(value,)`` of a JSON document, or None if it is not JSON (then it is read as YAML, of
    which flow-style mappings such as ``{name: t}`` are JSON-like). NaN and Infinity are kept
    as text, for the models to refuse as numbers."""
    try:
        return (json.loads(text, parse_constant=str),)
    except json.JSONDecodeError:
        return None
    except RecursionError:
        checker.refuse("", DEEP, "flatten it")
    except ValueError as exc:  # a number of more digits than Python converts
        _unreadable(checker, exc)


def _unreadable(checker: _Checker, exc: ValueError) -> NoReturn:
    if "digits" in str(exc):
        limit = sys.get_int_max_str_digits()
        checker.refuse("", f"a number of more than {limit} digits", "write a smaller number")
    checker.refuse("", f"a value cannot be read: {brief(str(exc))[1:-1]}", "correct the value")


def _construct(text: str, source: str) -> Any:
    loader = Loader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return None
        _check_size(root, source)
        return loader.construct_document(root)
    finally:
        loader.dispose()


@dataclass
class _Frame:
    """A list or mapping being read: its field path, where it is (for errors), its entries so
    far and, in a mapping, the key whose value comes next (None: a key comes next)."""

    pattern: tuple[str, ...]
    where: str
    mapping: bool
    count: int = 0
    key: str | None = None


def _inside(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


class _Checker:
    """Counts nodes and checks depth, texts and entries, on YAML's events or a JSON value."""

    def __init__(self, source: str, bounds: Bounds | None) -> None:
        self.source, self.bounds, self.nodes = source, bounds, 0

    def refuse(self, where: str, message: str, fix: str) -> NoReturn:
        raise SpecError(self.source, [SpecProblem(where, message, fix)])

    def node(self, where: str, depth: int) -> None:
        self.nodes += 1
        if self.nodes > MAX_SPEC_NODES:
            self.refuse("", f"more than {MAX_SPEC_NODES} values (aliases expanded)", "write it out smaller")
        if depth > MAX_SPEC_DEPTH:
            self.refuse("", DEEP, "flatten it")

    def entries(self, pattern: tuple[str, ...], where: str, count: int) -> None:
        if self.bounds is None:
            return
        bound = self.bounds.get(pattern, ANY)
        if count > bound.entries:
            self.refuse(where, f"more than {bound.entries} {bound.what}", bound.fix)

    def text(self, where: str, value: str) -> None:
        if self.bounds is not None and len(value) > MAX_TEXT_CHARS:
            self.refuse(where, f"a text longer than {MAX_TEXT_CHARS} characters", "shorten it")

    def walk(self, value: Any, pattern: tuple[str, ...], where: str, depth: int) -> None:
        self.node(where, depth)
        if isinstance(value, str):
            self.text(where, value)
        elif isinstance(value, dict):
            self.entries(pattern, where, len(value))
            for key, item in value.items():
                self.node(where, depth + 1)
                self.text(where, key)
                self.walk(item, (*pattern, key), _inside(where, key), depth + 1)
        elif isinstance(value, list):
            self.entries(pattern, where, len(value))
            for index, item in enumerate(value):
                self.walk(item, (*pattern, "[]"), f"{where}[{index}]", depth + 1)

    def events(self, events: Iterable[yaml.Event]) -> None:
        """Check a YAML document as its parser reads it: refused at the first node past a bound."""
        stack: list[_Frame] = []
        for event in events:
            if isinstance(event, yaml.CollectionEndEvent):
                stack.pop()
            if not isinstance(event, yaml.NodeEvent):
                continue
            pattern, where = self._child(stack[-1], event) if stack else ((), "")
            self.node(where, len(stack))
            if isinstance(event, yaml.ScalarEvent):
                self.text(where, event.value)
            elif isinstance(event, yaml.CollectionStartEvent):
                stack.append(_Frame(pattern, where, isinstance(event, yaml.MappingStartEvent)))

    def _child(self, frame: _Frame, event: yaml.NodeEvent) -> tuple[tuple[str, ...], str]:
        """The field path and place of a node read inside ``frame``, its entries counted."""
        if frame.mapping and frame.key is not None:  # a key's value
            key, frame.key = frame.key, None
            return (*frame.pattern, key), _inside(frame.where, key)
        frame.count += 1
        self.entries(frame.pattern, frame.where, frame.count)
        if not frame.mapping:
            return (*frame.pattern, "[]"), f"{frame.where}[{frame.count - 1}]"
        frame.key = event.value if isinstance(event, yaml.ScalarEvent) else "?"
        return (*frame.pattern, "?"), frame.where


def _check_size(root: yaml.Node, source: str) -> None:
    """Refuse a document whose nodes, aliases expanded, exceed MAX_SPEC_NODES or whose nesting
    exceeds MAX_SPEC_DEPTH. Each node is sized once (an alias is the same node object)."""
    sizes: dict[int, int] = {}

    def size(node: yaml.Node, depth: int) -> int:
        if depth > MAX_SPEC_DEPTH:
            raise SpecError(source, [SpecProblem("", DEEP, "flatten it")])
        if id(node) not in sizes:
            children: list[yaml.Node] = []
            if isinstance(node, yaml.SequenceNode):
                children = list(node.value)
            elif isinstance(node, yaml.MappingNode):
                children = [part for pair in node.value for part in pair]
            sizes[id(node)] = min(1 + sum(size(c, depth + 1) for c in children), MAX_SPEC_NODES + 1)
        return sizes[id(node)]

    if size(root, 0) > MAX_SPEC_NODES:
        raise SpecError(
            source,
            [
                SpecProblem(
                    "", f"more than {MAX_SPEC_NODES} values (aliases expanded)", "write it out smaller"
                )
            ],
        )

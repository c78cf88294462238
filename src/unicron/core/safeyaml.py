"""YAML (and JSON, a subset of it) from outside, parsed safely and within bounds: safe types
only, a bounded size, node count (aliases expanded) and depth; errors quote no more than a few
characters of the input."""

from __future__ import annotations

from typing import Any

import yaml

from unicron.core.errors import SpecError, SpecProblem
from unicron.core.limits import MAX_SPEC_BYTES, MAX_SPEC_DEPTH, MAX_SPEC_NODES, brief


def load_yaml_text(text: str, source: str) -> Any:
    """YAML (or JSON) parsed safely, within core.limits: its size, its node count with aliases
    expanded (an alias bomb is refused before anything expands it) and its depth."""
    if len(text) > MAX_SPEC_BYTES:
        raise SpecError(source, [SpecProblem("", f"larger than {MAX_SPEC_BYTES} bytes", "split it up")])
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        if root is not None:
            _check_size(root, source)
        return yaml.safe_load(text)
    except RecursionError:
        raise SpecError(
            source, [SpecProblem("", f"nested deeper than {MAX_SPEC_DEPTH} levels", "flatten it")]
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecError(
            source, [SpecProblem(where, f"not valid YAML: {brief(problem)[1:-1]}", "correct the YAML syntax")]
        ) from None


def _check_size(root: yaml.Node, source: str) -> None:
    """Refuse a document whose nodes, aliases expanded, exceed MAX_SPEC_NODES or whose nesting
    exceeds MAX_SPEC_DEPTH. Each node is sized once (an alias is the same node object)."""
    sizes: dict[int, int] = {}

    def size(node: yaml.Node, depth: int) -> int:
        if depth > MAX_SPEC_DEPTH:
            raise SpecError(
                source, [SpecProblem("", f"nested deeper than {MAX_SPEC_DEPTH} levels", "flatten it")]
            )
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
